#!/usr/bin/env python3
"""The BPE pre-tokenizers (gpud/tok_pre.c) against the models' own
expressions, run by a regex engine.

gpud writes each pre-tokenizer's expressions as hand-made matchers; this
test runs the expressions themselves, as llama.cpp does, and compares the
splits on a few thousand random texts and on hand-picked ones:

- every code point is "collapsed" to one character standing for its class
  (ASCII kept as is; other white space to \\v; other letters, numbers,
  punctuation, marks and symbols to one character each), and \\p{L} and its
  kind become those characters plus the ASCII ranges of the class: this is
  how llama.cpp runs an expression with Unicode classes through a regex
  engine without them (and why Tekken's [^a-z] takes every non-ASCII
  letter);
- each expression of a list cuts every piece the one before made: what it
  matches and the runs between matches become pieces.

Python's re (ASCII \\s, ordered alternatives, backtracking) reads these
expressions as ECMAScript does. Usage: tok_pre_ref.py TOK_PRE_DUMP
"""
import random
import re
import subprocess
import sys
import unicodedata

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = (CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SEED_CODER = (CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
DEEPSEEK_CODER = ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
                  r"\p{N}"]

# One name of each pre-tokenizer, and aliases that must read the same.
PRE = {
    "default": DEFAULT,
    "gpt-2": [GPT2],
    "llama-bpe": [LLAMA3],
    "starcoder": [r"\p{N}", GPT2],
    "qwen2": [QWEN2],
    "tekken": [TEKKEN],
    "seed-coder": [SEED_CODER],
    "deepseek-coder": DEEPSEEK_CODER,
}
ALIASES = {"llama3": "llama-bpe", "falcon3": "llama-bpe", "pixtral": "llama-bpe",
           "smaug-bpe": "llama-bpe", "smollm": "starcoder", "command-r": "starcoder",
           "deepseek-r1-qwen": "qwen2", "megrez": "qwen2", "mpt": "gpt-2", "olmo": "gpt-2"}

# The collapsed classes: a stand-in character and the ASCII members.
CLASS = {
    "N": ("\xd1", "0-9"),
    "L": ("\xd2", "A-Za-z"),
    "P": ("\xd3", r"!-#%-*,-/:-;?-@\[-\]_{}"),
    "M": ("\xd4", ""),
    "S": ("\xd5", r"$+<->\^`|~"),
}
# Unicode White_Space beyond ASCII
WHITE = {0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000} | set(range(0x2000, 0x200B))


def collapse(text):
    out = []
    for ch in text:
        c = ord(ch)
        if c < 128:
            out.append(ch)
        elif c in WHITE:
            out.append("\x0b")
        else:
            k = unicodedata.category(ch)[0]
            out.append(CLASS[k][0] if k in CLASS else "\xd0")
    return "".join(out)


def translate(expr):
    out, inside, i = [], False, 0
    while i < len(expr):
        if expr[i] == "\\" and i + 1 < len(expr) and expr[i + 1] != "p":
            out.append(expr[i:i + 2])
            i += 2
            continue
        m = re.match(r"\\p\{(\w)\}", expr[i:])
        if m:
            stand, ascii_ = CLASS[m.group(1)]
            body = stand + ascii_
            out.append(body if inside else "[" + body + "]")
            i += m.end()
            continue
        if expr[i] == "[":
            inside = True
        elif expr[i] == "]":
            inside = False
        out.append(expr[i])
        i += 1
    return re.compile("".join(out), re.ASCII)


def split(name, text):
    """Pre-token end offsets (code points) of text."""
    coll = collapse(text)
    # an expression without Unicode classes runs on the code points
    # themselves, other white space as \v (llama.cpp's std::wregex path)
    wide = "".join("\x0b" if ord(ch) in WHITE else ch for ch in text)
    pieces = [(0, len(coll))]
    for expr in PRE[name]:
        rx, nxt = translate(expr), []
        subject = coll if "\\p{" in expr else wide
        for a, b in pieces:
            pos = a
            for m in rx.finditer(subject[a:b]):
                s, e = a + m.start(), a + m.end()
                if s > pos:
                    nxt.append((pos, s))
                nxt.append((s, e))
                pos = e
            if pos < b:
                nxt.append((pos, b))
        pieces = nxt
    return [b for _, b in pieces]


def byte_ends(text, ends):
    off, acc = [0], 0
    for ch in text:
        acc += len(ch.encode())
        off.append(acc)
    return [off[e] for e in ends]


# Characters whose class has not moved between Unicode versions.
POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") * 3 +
    list("0123456789") * 2 +
    list("  \t\n\r") * 3 +
    list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") +
    ["'s", "'T", "'re", "'VE", "'ll", "'d", "'M", "//", "\r\n", "\n\n", "   "] +
    list("éÉßñÑøØΩωдДжЖ中文日本あアｱ한글ﬁǅ") +        # letters; Lt ǅ
    list("٣൫²½Ⅻⅷ") +                          # Nd, No, Nl
    ["\u0301", "\u0308", "\u064b"] +              # marks
    ["\u00a0", "\u3000", "\u2028", "\u0085", "\u2003"] +  # white space
    list("«»…—–¿¡、。") + list("€©±→√😀") +        # punctuation, symbols
    ["\u200b", "\x01", "\x1f", "\x7f", "\ufeff"]   # format and control
)
WORDS = ["HelloWorld", "iPhone", "McDonald's", "ÉCOLE", "ÉcoleNORMALE", "ABC", "aBC", "AbC",
         "ÀB", "BÀ", "AÉB", "naïve", "XMLHttpRequest", "don't", "I'LL", "12345", "3.14159",
         "a/b//c", "http://x.y/z", "<|im_start|>", "  indented", "tab\tsep", "x\n/y",
         ")\n//", "!\r\n/", "ÀBC", "xÉBC", "1,234,567", "$100", "a|b~c^d", " 中文字", "한국어 ",
         " ,.", "ハロー"]


def random_text(rng):
    n = rng.randint(1, 24)
    return "".join(rng.choice(WORDS) if rng.random() < 0.15 else rng.choice(POOL)
                   for _ in range(n))


def main():
    rng = random.Random(20261206)
    cases = [(name, w) for name in PRE for w in WORDS]
    for name in PRE:
        cases += [(name, random_text(rng)) for _ in range(1500)]
    cases += [(alias, random_text(rng)) for alias in ALIASES for _ in range(50)]
    cases += [("no-such-pre", "x")]

    # Arbitrary bytes (invalid UTF-8 decodes one byte at a time to U+FFFD):
    # no reference, but the pieces must cover the text in increasing order.
    raw = [(name, bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))))
           for name in PRE for _ in range(300)]

    inp = "".join("%s %s\n" % (n, t.encode().hex()) for n, t in cases)
    inp += "".join("%s %s\n" % (n, b.hex()) for n, b in raw)
    out = subprocess.run([sys.argv[1]], input=inp.encode(), stdout=subprocess.PIPE,
                         check=True).stdout.decode().splitlines()
    if len(out) != len(cases) + len(raw):
        sys.exit("tok_pre_ref: %d answers for %d texts" % (len(out), len(cases) + len(raw)))
    raw_out, out = out[len(cases):], out[:len(cases)]

    bad = 0
    for (name, text), got in zip(cases, out):
        if name == "no-such-pre":
            if got != "unknown":
                print("FAIL: an unknown name was accepted: %r" % got)
                bad += 1
            continue
        want = byte_ends(text, split(ALIASES.get(name, name), text))
        have = [int(x) for x in got.split()[1:]] if got.startswith("ok") else None
        if have != want:
            bad += 1
            if bad <= 10:
                b = text.encode()
                print("FAIL %s %r\n  want %r\n  have %r" % (
                    name, text, [b[x:y].decode(errors="replace") for x, y in zip([0] + want, want)],
                    [b[x:y].decode(errors="replace") for x, y in zip([0] + have, have)]
                    if have else got))
    for (name, b), got in zip(raw, raw_out):
        ends = [int(x) for x in got.split()[1:]]
        if not got.startswith("ok") or not ends or ends[-1] != len(b) or \
                any(x >= y for x, y in zip([0] + ends, ends)):
            bad += 1
            print("FAIL %s on bytes %s: pieces ending at %r" % (name, b.hex(), ends))
    print("%d texts, %d pre-tokenizers and %d aliases: %d mismatches; %d byte strings "
          "covered" % (len(cases), len(PRE), len(ALIASES), bad, len(raw)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
