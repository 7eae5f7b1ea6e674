# gnuplot bench/results/sampling-2026-12-03.gp (from bench/results/)
set terminal pngcairo size 760,420 font "sans,10"
set output "sampling-2026-12-03.png"
set title "64 requests decoding at once, 128256-token vocabulary, 2 CPUs"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "decode tokens/s"
set xlabel "gpud.sample_threads"
set key top left
set yrange [0:*]
$d << EOD
threads "temperature 0.8, top-p 0.95" "greedy (arg max)"
"1 (before: 1, under the lock)" 513 2526
"1" 550 9135
"2" 1028 10658
"0 (one per CPU)" 1030 10655
EOD
plot $d using 2:xtic(1) title columnheader(2), '' using 3 title columnheader(3)
