#!/usr/bin/env bash
# bench/legacy32.sh - the Qwen2.5-0.5B shape (rows of 896, which no
# 256-weight K-quant block fits) in the types llama.cpp writes for it,
# through `gpud generate` on the CPU: prefill and decode tokens/s.
#
# usage: bench/legacy32.sh [GPUD] [MODELS_DIR] [RUNS] [TYPES]
#   GPUD        the gpud binary (default build/gpud/gpud)
#   MODELS_DIR  where the generated models are kept (default
#               /tmp/swarm-bench-q05; written once with `gpud mkmodel
#               --preset qwen2.5-0.5b`, about 0.35-0.55 GB each)
#   RUNS        runs per type, interleaved (default 3)
#   TYPES       comma-separated --type values (default
#               q8_0,q4_k_m,q5_k_m,q3_k,q5_0,q4_1,iq4_xs)
# Prints one markdown table: per type the tensors' types in the file, the
# file's size, and the best and median of the runs. Threads: 2 (or
# SWARM_BENCH_THREADS). The prompt is about 300 tokens of English text; 64
# tokens are generated greedily.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
gpud=${1:-build/gpud/gpud}
dir=${2:-/tmp/swarm-bench-q05}
runs=${3:-3}
types=${4:-q8_0,q4_k_m,q5_k_m,q3_k,q5_0,q4_1,iq4_xs}
threads=${SWARM_BENCH_THREADS:-2}
vocab=${SWARM_SHARED_DIR:-../shared}/tokenizer/ggml-vocab-qwen2.gguf

mkdir -p "$dir"
IFS=, read -ra tl <<<"$types"
for t in "${tl[@]}"; do
	[ -s "$dir/$t.gguf" ] && continue
	"$gpud" mkmodel --preset qwen2.5-0.5b --arch qwen2 --vocab-from "$vocab" --type "$t" \
		--seed 5 --out "$dir/$t.gguf" >/dev/null
done

prompt=""
for i in $(seq 1 12); do
	prompt+="The old lighthouse keeper climbed the stairs every evening at dusk, carrying a lamp and a notebook in which he wrote down the ships he saw. "
done

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$runs"); do
	for t in "${tl[@]}"; do
		line=$("$gpud" generate --model "$dir/$t.gguf" --prompt "$prompt" --max-tokens 64 \
			--threads "$threads" 2>&1 | grep -o 'prompt tokens: .*' | tail -n 1)
		# prompt tokens: N, prefill: P tok/s, generated: G, decode: D tok/s
		echo "$t $(echo "$line" | sed -E 's/prompt tokens: ([0-9]+), prefill: ([0-9.]+) tok\/s, generated: ([0-9]+), decode: ([0-9.]+) tok\/s/\1 \2 \4/')" >>"$out"
	done
done

best_median() { # best and median of the numbers on stdin
	sort -g | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.1f | %.1f", v[NR], m }'
}

echo "| --type | tensors (count) | file MB | prompt tokens | prefill tok/s best | median | decode tok/s best | median |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for t in "${tl[@]}"; do
	mix=$(python3 - "$dir/$t.gguf" <<'EOF' 2>/dev/null || echo "?"
import struct, sys
# tensor types from the GGUF header (v3): counts of each matrix type
names = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_k",
         11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k", 20: "iq4_nl", 23: "iq4_xs", 30: "bf16"}
f = open(sys.argv[1], "rb")
def u32(): return struct.unpack("<I", f.read(4))[0]
def u64(): return struct.unpack("<Q", f.read(8))[0]
def s(): return f.read(u64())
def val(t):
    if t in (0, 1, 7): f.read(1)
    elif t in (2, 3): f.read(2)
    elif t in (4, 5, 6): f.read(4)
    elif t in (10, 11, 12): f.read(8)
    elif t == 8: s()
    elif t == 9:
        et, n = u32(), u64()
        for _ in range(n): val(et)
f.read(4); u32(); nt, nkv = u64(), u64()
for _ in range(nkv):
    s(); val(u32())
c = {}
for _ in range(nt):
    s(); nd = u32(); [u64() for _ in range(nd)]; ty = u32(); u64()
    if nd == 2: c[names.get(ty, str(ty))] = c.get(names.get(ty, str(ty)), 0) + 1
print(", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])))
EOF
)
	mb=$(( $(stat -c %s "$dir/$t.gguf") / 1000000 ))
	n=$(awk -v t="$t" '$1 == t { print $2; exit }' "$out")
	pf=$(awk -v t="$t" '$1 == t { print $3 }' "$out" | best_median)
	dc=$(awk -v t="$t" '$1 == t { print $4 }' "$out" | best_median)
	echo "| $t | $mix | $mb | $n | $pf | $dc |"
done
