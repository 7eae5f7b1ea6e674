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
