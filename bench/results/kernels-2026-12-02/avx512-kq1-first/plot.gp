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
