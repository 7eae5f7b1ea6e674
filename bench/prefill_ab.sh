#!/usr/bin/env bash
# bench/prefill_ab.sh - two builds' bench_prefill (long prompts on the CPU
# backend), interleaved, best of the runs per row, and a plot.
#
#   bench/prefill_ab.sh BASE NEW OUTDIR [RUNS [TOKENS]]
#
# BASE and NEW are bench_prefill binaries (say, one built from an older
# commit in a worktree with today's bench/bench_prefill.c, and
# build/bench/bench_prefill); each runs RUNS times (default 2), base, new,
# base, new ..., as bench_prefill --seconds 2 --tokens TOKENS (default
# 128,256,512,1024,2048,4096) --models-dir SWARM_BENCH_MODELS (default
# /tmp/swarm-bench-models). OUTDIR gets each run's table (base-N.md,
# new-N.md), summary.md (per model and length: the best of base's runs,
# of new's, and new / base) and, when gnuplot is there, prefill.png
# (tok/s by prompt length, each model before and after). RUNS 0 redoes
# the summary and the plot from OUTDIR's tables. The machine
# should be quiet: nothing else is stopped here.
set -euo pipefail

base=$(realpath "${1:?usage: prefill_ab.sh BASE NEW OUTDIR [RUNS [TOKENS]]}")
new=$(realpath "${2:?}")
outdir=${3:?}
runs=${4:-2}
tokens=${5:-128,256,512,1024,2048,4096}
models=${SWARM_BENCH_MODELS:-/tmp/swarm-bench-models}
mkdir -p "$outdir" "$models"
outdir=$(realpath "$outdir")

for r in $(seq 1 "$runs"); do
	for b in base new; do
		bin=$base
		[ "$b" = new ] && bin=$new
		echo "prefill_ab: $b, run $r of $runs" >&2
		"$bin" --seconds 2 --tokens "$tokens" --models-dir "$models" \
			--out "$outdir/$b-$r.md" >/dev/null
	done
done

# rows "| model | head_dim | tokens | best ms | tok/s | mean ms |": the
# best ms per (build, model, tokens) over the runs
awk -F'|' -v out="$outdir" '
	FNR <= 2 { next }
	{
		b = FILENAME; sub(/.*\//, "", b); sub(/-[0-9]+\.md$/, "", b)
		m = $2; gsub(/^ +| +$/, "", m); hd = $3 + 0; n = $4 + 0; ms = $5 + 0
		k = m SUBSEP n
		if (!(k in hdim)) { order[++nk] = k; hdim[k] = hd }
		if (!((b, k) in best) || ms < best[b, k]) best[b, k] = ms
	}
	END {
		print "| model | head_dim | prompt tokens | base ms | new ms | base tok/s | new tok/s | new / base |" > out "/summary.md"
		print "|---|---:|---:|---:|---:|---:|---:|---:|" > out "/summary.md"
		for (i = 1; i <= nk; i++) {
			k = order[i]; split(k, p, SUBSEP)
			bm = best["base", k]; nm = best["new", k]
			printf "| %s | %d | %d | %.1f | %.1f | %.0f | %.0f | %.2fx |\n", p[1], hdim[k], p[2], bm, nm, p[2] / bm * 1e3, p[2] / nm * 1e3, bm / nm > out "/summary.md"
			f = p[1]; gsub(/[^A-Za-z0-9]+/, "_", f)
			printf "%d %.1f %.1f\n", p[2], p[2] / bm * 1e3, p[2] / nm * 1e3 > out "/" f ".dat"
			if (!(f in seen)) { seen[f] = 1; names[++nf] = f; labels[nf] = p[1] }
		}
		for (i = 1; i <= nf; i++)
			printf "%s\t%s\n", names[i], labels[i] > out "/models.tsv"
	}' "$outdir"/base-*.md "$outdir"/new-*.md
cat "$outdir/summary.md"

if command -v gnuplot >/dev/null; then
	n_runs=$(find "$outdir" -maxdepth 1 -name 'base-*.md' | wc -l)
	{
		echo "set terminal pngcairo size 900,560 font ',10' noenhanced"
		echo "set output '$outdir/prefill.png'"
		echo "set title 'CPU prefill of one long prompt in chunks of 512 tokens: tok/s (best of $n_runs runs)'"
		echo "set xlabel 'prompt tokens'; set ylabel 'tok/s'"
		echo "set logscale xy; set grid; set key outside right"
		printf "plot "
		sep=""
		i=1
		while IFS=$'\t' read -r f label; do
			printf "%s'%s/%s.dat' using 1:2 with linespoints dt 2 lc %d title '%s, base', " \
				"$sep" "$outdir" "$f" "$i" "$label"
			printf "'%s/%s.dat' using 1:3 with linespoints lc %d title '%s, new'" \
				"$outdir" "$f" "$i" "$label"
			sep=", "
			i=$((i + 1))
		done < "$outdir/models.tsv"
		echo
	} > "$outdir/prefill.gp"
	gnuplot "$outdir/prefill.gp"
fi
