# gnuplot bench/results/logprobs-2026-12-07.gp (from bench/results/)
set terminal pngcairo size 900,470 font "sans,10"
set output "logprobs-2026-12-07.png"
set title "One row of 128256 logits, one core: sampling and log probabilities (median of 64, two runs)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "microseconds per row (median)"
set key top right
set bmargin 4
set yrange [0:900]
$d << EOD
"greedy\n(arg max)" 46 29
"T 0.8\n(the draw)" 804 629
"logprobs, v1\n(libm expf; 1 run)" 514 NaN
"logprobs\n0 alt." 109 103
"logprobs\n5 alt." 167 129
"logprobs\n20 alt." 133 135
EOD
plot $d using 2:xtic(1) title "run 1", '' using 3 title "run 2"
