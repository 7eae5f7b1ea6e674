# gnuplot bench/results/sampling-2026-12-04.gp (from bench/results/)
set terminal pngcairo size 820,470 font "sans,10"
set output "sampling-2026-12-04.png"
set title "One row of 128256 logits, one core: the sampler before and after the exact draw (mean of 2 runs)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "microseconds per row (median)"
set key top right
set bmargin 4
set yrange [0:1600]
$d << EOD
"T 0.8" 600 648
"T 0.8\ntop-p 0.95" 1400 964
"T 0.8, top-k 40\ntop-p 0.95, min-p 0.05" 835 678
"T 0.8\nrepeat penalty 1.1" 598 688
EOD
plot $d using 2:xtic(1) title "before (46276b2)", '' using 3 title "now"
