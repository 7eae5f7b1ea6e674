#!/usr/bin/env bash
# bench/instructions.sh - instruction counts (valgrind callgrind) of the
# model path, for two builds side by side: a before/after check of a change
# that must not slow anything down, repeatable on a busy machine where
# wall-clock benchmarks swing by 2-3x.
#
#   bench/instructions.sh BUILD_A BUILD_B [SHARED_DIR]
#
# BUILD_A/B are meson build directories (e.g. one of a worktree at the old
# revision, one of the new). Each row runs the same command with both
# builds' `gpud`, single-threaded:
#   generate  stories260K, and models made by BUILD_B's `gpud mkmodel`
#             (dim 256, 4 layers, byte vocabulary) in q8_0, q4_0 and f16:
#             model load, tokenizing, prefill, 64-200 decode steps, sampling;
#   tokenize  docs/samples/*.txt with three vocabularies (load + encode).
# and prints a Markdown table: instructions of A, of B, the change, and
# whether the two outputs are byte-identical (they must be).
# SHARED_DIR defaults to the source root's ../shared.
set -euo pipefail

a=$(realpath "${1:?usage: bench/instructions.sh BUILD_A BUILD_B [SHARED_DIR]}")
b=$(realpath "${2:?usage: bench/instructions.sh BUILD_A BUILD_B [SHARED_DIR]}")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shared=${3:-$root/../shared}
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
tmp=$(mktemp -d /tmp/swarm-instr.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# instr BUILD TAG CMD...: runs CMD with BUILD's gpud under callgrind, keeps
# its stdout in $tmp/TAG.out and prints the instruction count.
instr() {
	local build=$1 tag=$2
	shift 2
	valgrind --tool=callgrind --callgrind-out-file="$tmp/$tag.cg" \
		"$build/gpud/gpud" "$@" >"$tmp/$tag.out" 2>"$tmp/$tag.log"
	grep -oE 'Collected : [0-9]+' "$tmp/$tag.log" | grep -oE '[0-9]+$'
}

row() {
	local name=$1 ia ib same
	shift
	ia=$(instr "$a" A "$@")
	ib=$(instr "$b" B "$@")
	same=no
	cmp -s "$tmp/A.out" "$tmp/B.out" && same=yes
	awk -v n="$name" -v x="$ia" -v y="$ib" -v s="$same" \
		'BEGIN { printf "| %s | %d | %d | %+.2f%% | %s |\n", n, x, y, (y - x) * 100.0 / x, s }'
}

echo "| run | instructions A | instructions B | B vs A | same output |"
echo "|---|---:|---:|---:|---|"
row "generate stories260K, 200 tokens" generate --model "$shared/models/stories260K.gguf" \
	--prompt "Once upon a time" --max-tokens 200 --threads 1
for t in q8_0 q4_0 f16; do
	"$b/gpud/gpud" mkmodel --out "$tmp/m-$t.gguf" --dim 256 --layers 4 --heads 8 \
		--kv-heads 4 --ffn 768 --vocab byte --type "$t" --seed 3 >/dev/null
	row "generate dim-256 $t, 64 tokens" generate --model "$tmp/m-$t.gguf" \
		--prompt "The tide comes in twice a day because" --max-tokens 64 --threads 1
done
text=$(cat "$root"/docs/samples/*.txt)
for v in llama-spm llama-bpe gpt-2; do
	row "tokenize samples, $v" tokenize --model "$shared/tokenizer/ggml-vocab-$v.gguf" "$text"
done
