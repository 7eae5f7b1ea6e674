#!/usr/bin/env bash
# bench/upload.sh - what a CUDA device's start-up spends packing a model's
# weights on the host (bench_upload: gpud_cuda_pack_rows_par; the types
# without CUDA kernels requantized to Q8_0), at 1 .. N threads.
#
# usage: bench/upload.sh [BUILD] [MODELS_DIR] [OUT]
#   BUILD       a build with -Dgpu=enabled or -Dcuemu=true (default build)
#   MODELS_DIR  generated models, written once (default /tmp/swarm-bench-upload):
#               Llama-3.2-3B-shaped Q4_K_M (Llama 3 vocabulary, 2.0 GB) and
#               Q8_0 (3.4 GB), Qwen2.5-0.5B-shaped Q4_K_M (Q5_0 fallbacks)
#   OUT         results prefix (default bench/results/upload-DATE): OUT.md,
#               OUT.dat, OUT.gp, OUT.png
# Threads: 1 up to nproc (at most 8, the backend's limit).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
dir=${2:-/tmp/swarm-bench-upload}
out=${3:-bench/results/upload-$(date -u +%Y-%m-%d)}
shared=${SWARM_SHARED_DIR:-../shared}
gpud=$build/gpud/gpud
bench=$build/bench/bench_upload
[ -x "$bench" ] || { echo "upload.sh: $bench missing (a -Dgpu=enabled build)" >&2; exit 2; }
mkdir -p "$dir" "$(dirname "$out")"
mk() { # NAME ARGS...
	local f=$dir/$1.gguf
	shift
	[ -s "$f" ] || "$gpud" mkmodel --out "$f" "$@" >/dev/null
}
mk 3b-q4_k_m --preset llama-3.2-3b --type q4_k_m --vocab-from "$shared/tokenizer/ggml-vocab-llama-bpe.gguf"
mk 3b-q8_0 --preset llama-3.2-3b --type q8_0 --vocab-from "$shared/tokenizer/ggml-vocab-llama-bpe.gguf"
mk q05-q4_k_m --preset qwen2.5-0.5b --type q4_k_m --vocab-from "$shared/tokenizer/ggml-vocab-qwen2.gguf"
n=$(nproc)
[ "$n" -gt 8 ] && n=8
{
	echo "# CUDA weight upload, host side ($(date -u +%Y-%m-%d))"
	echo
	echo "\`bench/upload.sh\` on $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), commit $(git rev-parse --short HEAD)."
	echo "Each row: one device's packing of the whole replica (no device touched; the file in the page cache)."
	echo
} >"$out.md"
: >"$out.dat"
for m in 3b-q4_k_m q05-q4_k_m 3b-q8_0; do
	for t in $(seq 1 "$n"); do
		r=$("$bench" --model "$dir/$m.gguf" --rounds 3 --threads "$t")
		{ echo "## $m, $t thread(s)"; echo; echo "$r" | tail -n +3; echo; } >>"$out.md"
		s=$(echo "$r" | awk -F'|' '/^\| all /{gsub(/ /,"",$7); print $7}')
		echo "$m $t $s" >>"$out.dat"
	done
done
cat >"$out.gp" <<GP
set terminal pngcairo size 800,450 noenhanced
set output '$out.png'
set title 'CUDA upload: host packing of the replica (requantizing to Q8_0)'
set style data histograms
set style histogram cluster gap 1
set style fill solid 0.8
set ylabel 'seconds (best of 3)'
set xlabel 'threads'
set key top right
plot for [m in "3b-q4_k_m q05-q4_k_m 3b-q8_0"] '< grep "^'.m.' " $out.dat' using 3:xtic(2) title m
GP
gnuplot "$out.gp" 2>/dev/null || echo "upload.sh: gnuplot failed (plot skipped)" >&2
cat "$out.md"
