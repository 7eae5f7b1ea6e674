#!/usr/bin/env python3
"""cu2cc.py - a CUDA source as cuemu C++ (tests/cuemu/README.md).

    cu2cc.py IN.cu OUT.cc

Rewrites what is not C++: every launch `kernel<targs><<<grid, block[, shm[,
stream]]>>>(args)` becomes `cuemu_launch("kernel", BOUND, grid, block, shm,
stream, kernel<targs>, args)`, BOUND being the expression of the kernel's
__launch_bounds__ in the same file (0 without one), and `extern __shared__ T
name[];` becomes a pointer to the launch's dynamic shared memory;
`cudaLaunchKernelEx(cfg, kernel<targs>, args)` becomes
`cuemu_launch_ex("kernel", BOUND, cfg, kernel<targs>, args)`; each static
`__shared__ T a[N], b;` becomes `__shared__ T cuemu_sh_a[N], cuemu_sh_b;
auto &a = cuemu::shared_at(&cuemu_sh_a); auto &b = ...;`: the variables
live in the block's shared memory, after the dynamic part (each block's
first thread to pass fills one with 0xff: nothing left by the block
before), and their renamed statics only name them. Nothing
else changes; line numbers are kept, and a #line directive names the .cu, so
compiler messages point into it.
"""
import re
import sys


def split_top(s):
    """s split at its top-level commas (not inside (), [], {} or <>)."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def bounds(src):
    """kernel name -> its __launch_bounds__ expression (max threads)."""
    b = {}
    for m in re.finditer(r"__launch_bounds__\s*\(((?:[^()]|\([^()]*\))*)\)\s*(\w+)\s*\(", src):
        b[m.group(2)] = split_top(m.group(1))[0]
    return b


LAUNCH = re.compile(r"(?P<kern>[A-Za-z_]\w*)(?P<targs>\s*<[^<>;{}]*>)?\s*<<<(?P<cfg>.*?)>>>\s*\(",
                    re.S)


LAUNCH_EX = re.compile(r"\bcudaLaunchKernelEx\s*\(")
# the kernel argument, after blanks (and line continuations in a macro)
KERN = re.compile(r"(?:\s|\\\n)*(?P<kern>[A-Za-z_]\w*)(?P<targs>\s*<[^<>;{}]*>)?\s*[,)]")


def convert_ex(src, lb, path):
    """cudaLaunchKernelEx(cfg, kernel<targs>, args) calls as cuemu_launch_ex."""
    out, pos = "", 0
    for m in LAUNCH_EX.finditer(src):
        if m.start() < pos:
            continue
        # the configuration: up to the first comma outside brackets
        depth, i = 0, m.end()
        while i < len(src) and not (src[i] == "," and depth == 0):
            depth += src[i] in "([{"
            depth -= src[i] in ")]}"
            i += 1
        k = KERN.match(src, i + 1)
        if not k:
            sys.exit("%s: a cudaLaunchKernelEx whose kernel cu2cc.py cannot name" % path)
        kern = k.group("kern")
        bound = "(%s)" % lb[kern] if kern in lb else "0"
        out += src[pos:m.start()] + 'cuemu_launch_ex("%s", %s, %s,' % (
            kern, bound, src[m.end():i])
        pos = i + 1
    return out + src[pos:]


# a static __shared__ declaration on one line: `__shared__ TYPE a[N], b;`
# (extern ones are gone by then; a comment's __shared__ has no `;` after it
# on its line, or one the compiler does not see)
SHARED = re.compile(r"\b__shared__[ \t]+(?P<decl>[^;{}()\n]*(?:\([^;{}()\n]*\)[^;{}()\n]*)*);")


def place(m):
    """the declaration with each variable renamed (its storage, never
    touched), then a reference of the variable's own name to where the
    block's shared memory holds it (cuemu::shared_at; on the same line)."""
    decls = split_top(m.group("decl"))
    names, out = [], []
    for i, d in enumerate(decls):
        head, br, tail = d.partition("[")
        name = re.search(r"(\w+)\s*$", head)
        if not name or (i == 0 and head.strip() == name.group(1)):
            sys.exit("cu2cc.py: a __shared__ declaration cu2cc.py cannot read: %s" % m.group(0))
        names.append(name.group(1))
        out.append(head[:name.start(1)] + "cuemu_sh_" + name.group(1) + head[name.end(1):] + br + tail)
    return "__shared__ " + ", ".join(out) + ";" + "".join(
        " auto &%s = cuemu::shared_at(&cuemu_sh_%s);" % (n, n) for n in names)


def convert(src, path):
    lb = bounds(src)

    def launch(m):
        cfg = split_top(m.group("cfg"))
        if not 2 <= len(cfg) <= 4:
            sys.exit("%s: a launch with %d configuration arguments" % (path, len(cfg)))
        cfg += ["0", "0"][len(cfg) - 2:]
        kern = m.group("kern")
        fn = kern + (m.group("targs") or "")
        bound = "(%s)" % lb[kern] if kern in lb else "0"
        # the launch's own text may span lines: keep the count
        nl = "\n" * m.group(0).count("\n")
        rest = src[m.end():]
        sep = "" if rest.lstrip().startswith(")") else ", "
        return 'cuemu_launch("%s", %s, dim3(%s), dim3(%s), (size_t)(%s), %s, %s%s%s' % (
            kern, bound, cfg[0], cfg[1], cfg[2], cfg[3], fn, sep, nl)

    out = LAUNCH.sub(launch, src)
    out = convert_ex(out, lb, path)
    out = re.sub(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w\s\*]+?)\s*(\w+)\s*\[\s*\]\s*;",
                 r"\1 *\2 = (\1 *)cuemu::dyn_smem();", out)
    out = SHARED.sub(place, out)
    return '#line 1 "%s"\n%s' % (path, out)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cu2cc.py IN.cu OUT.cc")
    src = open(sys.argv[1]).read()
    if "<<<" in src and "cuemu_launch" in src:
        sys.exit("%s: already converted" % sys.argv[1])
    out = convert(src, sys.argv[1])
    if "<<<" in out:
        sys.exit("%s: a launch cu2cc.py could not rewrite" % sys.argv[1])
    open(sys.argv[2], "w").write(out)


if __name__ == "__main__":
    main()
