#!/usr/bin/env bash
# bench/engine_ab.sh - two builds' engines on the llama-3.2-3b preset,
# interleaved, with the memory's read bandwidth measured in every run.
#
#   bench/engine_ab.sh BASE_ENGINE NEW_ENGINE OUTDIR [RUNS [TYPES]]
#
# BASE_ENGINE and NEW_ENGINE are bench_engine binaries (say, one built
# from an older commit in a worktree, and build/bench/bench_engine); each
# is run RUNS times (default 3; 0 redoes the summary and plots of OUTDIR's
# runs.tsv), alternating base, new, base, new ..., as
#   bench_engine --3b --batch1-only --types TYPES --seconds 3
# (TYPES default "f16,q8_0,q4_0,q4_k_m"; the models are written once into
# SWARM_BENCH_MODELS, default /tmp/swarm-bench-models, by the first run:
# minutes). Run from the project root (bench_engine reads ../shared/).
# Both binaries read the same model files. OUTDIR gets runs.tsv (one line
# per build, run and type: prefill tok/s, decode tok/s, decode weight
# GB/s, the read bandwidth measured beside that model's decode steps, and
# the share of it that the decode steps' mean took over the means of the
# passes), summary.tsv (best of the runs per build and type, the read
# bandwidth beside that run and the share of it, then the medians of the
# runs, with the median share of the means) and, when gnuplot is there,
# decode.png, prefill.png and share.png (plot.gp). Both binaries must print
# bench_engine's table of 2026-12-02 or later (the read columns beside
# decode): to A/B older kernels, build the base with today's bench/. The summary is printed. The machine should be quiet: nothing else is stopped here.
set -euo pipefail

base=$(realpath "${1:?usage: engine_ab.sh BASE_ENGINE NEW_ENGINE OUTDIR [RUNS [TYPES]]}")
new=$(realpath "${2:?}")
outdir=${3:?}
runs=${4:-3}
types=${5:-f16,q8_0,q4_0,q4_k_m}
models=${SWARM_BENCH_MODELS:-/tmp/swarm-bench-models}
mkdir -p "$outdir" "$models"
outdir=$(realpath "$outdir")

runs_tsv=$outdir/runs.tsv
# RUNS 0: no runs, the summary and plots again from OUTDIR's runs.tsv
[ "$runs" -gt 0 ] || [ -f "$runs_tsv" ] || { echo "engine_ab: no $runs_tsv" >&2; exit 1; }
[ "$runs" -eq 0 ] ||
	printf 'build\trun\ttype\tprefill_tok_s\tdecode_tok_s\tdecode_gbs\tread_gbs\tshare_mean\n' > "$runs_tsv"
# The order alternates (base first in odd runs, new first in even ones):
# on this machine the first binary of a pair tended to run ~5-10% faster
# (prefill of unchanged kernels 0.88-0.92x as "new").
for r in $(seq 1 "$runs"); do
	order="base new"
	[ $((r % 2)) -eq 0 ] && order="new base"
	for b in $order; do
		bin=$base
		[ "$b" = new ] && bin=$new
		out=$outdir/run-$b-$r.txt
		"$bin" --3b --batch1-only --types "$types" --models-dir "$models" \
			--seconds 3 > "$out" 2> "$outdir/run-$b-$r.err"
		# | gen-3B | type | MB | prefill | - | decode | GB/s | read GB/s
		# beside | % | % of the means | ...
		awk -F'|' -v b="$b" -v r="$r" '$2 ~ /gen-3B/ {
			for (i = 3; i <= 11; i++) gsub(/[ %]/, "", $i)
			printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", b, r, $3, $5, $7, $8, $9, $11
		}' "$out" >> "$runs_tsv"
		echo "run $r $b: done" >&2
	done
done

# Best of the runs per build and type (the run that had the machine), and
# the medians: on a shared machine one lucky run can make a best-of.
summary=$outdir/summary.tsv
awk -F'\t' '
function median(list,    a, n, i, j, v) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) { # insertion sort: a handful of runs
		v = a[i] + 0
		for (j = i - 1; j >= 1 && a[j] + 0 > v; j--)
			a[j + 1] = a[j]
		a[j + 1] = v
	}
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
NR > 1 {
	k = $1 "\t" $3
	if (!(k in dec) || $5 > dec[k]) { dec[k] = $5; gbs[k] = $6; rd[k] = $7 }
	if (!(k in pre) || $4 > pre[k]) pre[k] = $4
	decs[k] = decs[k] " " $5
	pres[k] = pres[k] " " $4
	shares[k] = shares[k] " " $8
	types[$3] = 1
}
END {
	for (t in types) {
		b = "base\t" t; n = "new\t" t
		printf "%s\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t%.0f%%", t, pre[b],
		       pre[n], pre[n] / pre[b], dec[b], dec[n], dec[n] / dec[b], gbs[n], rd[n],
		       100 * gbs[n] / rd[n]
		printf "\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.2f\t%.0f%%\t%.0f%%\n", median(pres[b]),
		       median(pres[n]), median(pres[n]) / median(pres[b]), median(decs[b]),
		       median(decs[n]), median(decs[n]) / median(decs[b]), median(shares[b]),
		       median(shares[n])
	}
}' "$runs_tsv" | sort > "$summary.rows"
# the header first, as a comment (gnuplot skips it)
{
	printf "#type\tbase_prefill\tnew_prefill\tprefill_x\tbase_decode\tnew_decode\tdecode_x\t"
	printf "new_decode_gbs\tread_gbs\tshare_of_read\tbase_prefill_med\tnew_prefill_med\t"
	printf "prefill_med_x\tbase_decode_med\tnew_decode_med\tdecode_med_x\t"
	printf "base_share_of_means_med\tnew_share_of_means_med\n"
	cat "$summary.rows"
} > "$summary"
rm -f "$summary.rows"
column -t -s "$(printf '\t')" "$summary"

if command -v gnuplot > /dev/null; then
	cat > "$outdir/plot.gp" <<'EOF'
set terminal pngcairo size 900,480 font ",11" noenhanced
set datafile separator "\t"
set yrange [0:*]
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set key top left
set grid ytics
set boxwidth 0.9
set output "decode.png"
set title "3B preset, batch-1 decode, 2 threads (best of the runs)"
set ylabel "tokens/s"
plot "summary.tsv" using 5:xtic(1) title "base", "" using 6 title "new"
set output "prefill.png"
set title "3B preset, prefill of 32 tokens, 2 threads (best of the runs)"
plot "summary.tsv" using 2:xtic(1) title "base", "" using 3 title "new"
set output "share.png"
set title "3B preset, batch-1 decode: share of the read bandwidth beside it (median of the runs' means)"
set ylabel "% of read bandwidth"
set yrange [0:120]
plot "summary.tsv" using (column(17)):xtic(1) title "base", "" using (column(18)) title "new", 80 title "goal (80%)" with lines lw 2 dt 2
EOF
	(cd "$outdir" && gnuplot plot.gp)
fi
