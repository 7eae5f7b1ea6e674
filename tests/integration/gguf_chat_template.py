#!/usr/bin/env python3
"""gguf_chat_template.py - a copy of a GGUF file with tokenizer.chat_template set.

    gguf_chat_template.py IN OUT TEMPLATE

stories260K (the test model) carries no chat template, so gpud refuses chat
requests on it; the tests that need chat (openai_client_test.sh) give a
copy one. gpud picks its chat format from the template's text ("[INST]":
Llama 2, "<|start_header_id|>": Llama 3; gpud/tok_load.c), so TEMPLATE only
has to name the format. The header is rewritten with the key added (or
replaced), the tensor infos are kept as they are (their offsets count from
the data section), and the data section is copied after padding to the
file's alignment (general.alignment, else 32). GGUF v2 and v3.
"""
import struct
import sys

# value sizes of the fixed-size GGUF types
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
T_STRING, T_ARRAY, T_U32 = 8, 9, 4
KEY = b"tokenizer.chat_template"


def skip_value(buf, pos, vtype):
    """The offset just past a value of vtype at pos."""
    if vtype in FIXED:
        return pos + FIXED[vtype]
    if vtype == T_STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == T_ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in FIXED:
            return pos + FIXED[etype] * count
        for _ in range(count):
            pos = skip_value(buf, pos, etype)
        return pos
    raise ValueError(f"unknown GGUF value type {vtype}")


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: gguf_chat_template.py IN OUT TEMPLATE")
    src, dst, template = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    buf = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version not in (2, 3):
        sys.exit(f"{src}: not a GGUF v2/v3 file")
    pos = 24
    kvs = []  # (key, raw bytes of the whole entry)
    alignment = 32
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + klen]
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if key == b"general.alignment" and vtype == T_U32:
            (alignment,) = struct.unpack_from("<I", buf, pos)
        pos = skip_value(buf, pos, vtype)
        if key != KEY:
            kvs.append(buf[start:pos])
    tstart = pos
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + nlen
        (ndims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * ndims + 4 + 8
    tinfo = buf[tstart:pos]
    data = buf[(pos + alignment - 1) // alignment * alignment:]
    entry = (struct.pack("<Q", len(KEY)) + KEY + struct.pack("<IQ", T_STRING, len(template)) +
             template)
    head = struct.pack("<4sIQQ", b"GGUF", version, n_tensors, len(kvs) + 1)
    head += b"".join(kvs) + entry + tinfo
    head += b"\0" * ((-len(head)) % alignment)
    with open(dst, "wb") as f:
        f.write(head)
        f.write(data)


if __name__ == "__main__":
    main()
