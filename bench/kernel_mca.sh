#!/usr/bin/env bash
# bench/kernel_mca.sh - where one matmul kernel's cycles go, without
# hardware counters: profile bench_matmul on one type and batch, take the
# innermost loop that holds most of the samples of the hottest function,
# and give that loop to llvm-mca (cycles per iteration, and the pressure
# on each of the CPU's execution ports).
#
#   bench/kernel_mca.sh [TYPE [BATCH [BENCH_MATMUL]]]
#
# TYPE as bench_matmul takes it (default q5_kp: Q5_K in the packed layout),
# BATCH one of the 3b mode's batches (default 1), BENCH_MATMUL the binary
# (default build/bench/bench_matmul). MCPU picks llvm-mca's model (default:
# this machine's CPU; znver3, skylake, sapphirerapids ...). Prints the
# loop's size, the instructions touching the stack (spills), llvm-mca's
# cycles per iteration and its busiest resources. The profile uses the
# cpu-clock software event, so it works in VMs where `perf stat` says
# "not supported". Needs perf (linux-perf), objdump (binutils) and
# llvm-mca (llvm).
#
# Used for issue 16's K-quant kernels: a chunk of packed Q5_K at batch 1
# went from ~30 to ~23 modelled cycles when its shifts became constants.
set -euo pipefail

type=${1:-q5_kp}
batch=${2:-1}
bin=${3:-build/bench/bench_matmul}
for tool in perf objdump llvm-mca python3; do
	command -v "$tool" > /dev/null || {
		echo "kernel_mca: $tool is missing (apt-get install linux-perf binutils llvm python3)" >&2
		exit 1
	}
done
[ -x "$bin" ] || { echo "kernel_mca: no $bin (build first: ninja -C build)" >&2; exit 1; }

work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $work" >&2 || rm -rf "$work"' EXIT
perf record -q -e cpu-clock -o "$work/perf.data" "$bin" 3b "$type" "$batch" > /dev/null 2> "$work/perf.err" ||
	{ cat "$work/perf.err" >&2; exit 1; }
# the hottest matmul row function (the setup's quantizer is not the point)
sym=$(perf report -i "$work/perf.data" --stdio --sort symbol 2> /dev/null |
	awk '!done && /^ +[0-9.]+%/ && /mm_rows/ { for (i = 1; i < NF; i++) if ($i == "[.]") { print $(i + 1); done = 1 } }')
[ -n "$sym" ] || { echo "kernel_mca: no samples in a matmul row function" >&2; exit 1; }
perf annotate -i "$work/perf.data" --stdio -s "$sym" > "$work/annotate.txt" 2> /dev/null || true
objdump -d --no-show-raw-insn "$bin" > "$work/dis.txt"

python3 - "$work" "$sym" << 'PY'
import re, sys

work, sym = sys.argv[1], sys.argv[2]
hot = {}
for line in open(work + '/annotate.txt'):
    m = re.match(r'\s*([0-9.]+)\s*:\s*([0-9a-f]+):', line)
    if m:
        hot[int(m.group(2), 16)] = float(m.group(1))
ins = []
for line in open(work + '/dis.txt'):
    m = re.match(r'\s+([0-9a-f]+):\s+(.*)', line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2).strip()))
total = sum(hot.values()) or 1.0
best = None
for addr, text in ins:
    m = re.match(r'j\w+\s+([0-9a-f]+)', text)
    if not m or int(m.group(1), 16) >= addr:
        continue
    lo = int(m.group(1), 16)
    share = sum(v for k, v in hot.items() if lo <= k <= addr)
    if share >= 0.4 * total and (best is None or addr - lo < best[1] - best[0]):
        best = (lo, addr, share)
if best is None:
    sys.exit('kernel_mca: no loop holds 40% of the samples of ' + sym)
lo, hi, share = best
body = [re.sub(r'<[^>]*>', '', t) for a, t in ins
        if lo <= a < hi and not re.match(r'(j\w+|nop|cs nop|data16)\b', t)]
open(work + '/loop.s', 'w').write('\n'.join(body) + '\n')
print('%s: loop %x-%x holds %.0f%% of its samples: %d instructions, %d on the stack'
      % (sym, lo, hi, share / total * 100, len(body), sum('(%rsp' in t for t in body)))
PY

mcpu=()
[ -n "${MCPU:-}" ] && mcpu=(-mcpu="$MCPU")
llvm-mca "${mcpu[@]}" -iterations=100 "$work/loop.s" > "$work/mca.txt" 2>&1 ||
	{ cat "$work/mca.txt" >&2; exit 1; }
grep -E '^(Iterations|Total Cycles|Block RThroughput|IPC):' "$work/mca.txt"
awk '/^Iterations:/ { it = $2 } /^Total Cycles:/ { printf "cycles per iteration: %.1f\n", $3 / it }' \
	"$work/mca.txt"
# The busiest resources: names from the "Resources:" table, pressure from
# the "Resource pressure per iteration" line.
python3 - "$work/mca.txt" << 'PY'
import re, sys

text = open(sys.argv[1]).read()
names = re.findall(r'^\[([0-9.]+)\]\s+- (\S+)', text, re.M)
m = re.search(r'Resource pressure per iteration:\n(.*)\n(.*)\n', text)
if m:
    heads = re.findall(r'\[([0-9.]+)\]', m.group(1))
    vals = m.group(2).split()
    lookup = dict(names)
    pairs = sorted(((float(v), lookup.get(h, h)) for h, v in zip(heads, vals) if v != '-'),
                   reverse=True)
    print('busiest: ' + ', '.join('%s %.1f' % (n, v) for v, n in pairs[:6]))
PY
