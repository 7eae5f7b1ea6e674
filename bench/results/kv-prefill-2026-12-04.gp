# gnuplot bench/results/kv-prefill-2026-12-04.gp (from bench/results/)
set terminal pngcairo size 820,470 font "sans,10"
set output "kv-prefill-2026-12-04.png"
set title "CPU prefill of one L-token prompt, 2 threads: attention per token vs in tiles of 8 (mean of 3 runs)"
set logscale xy 2
set xlabel "prompt length L (tokens)"
set ylabel "prefill tokens/s"
set key top right
set grid
$d << EOD
512 1981 2665 1869 2517
1024 1139 1581 1015 1524
2048 705 1060 591 1004
4096 413 674 338 592
8192 216 375 174 317
EOD
plot $d using 1:2 with linespoints dt 2 lc 1 title "f32 KV, before", \
     '' using 1:3 with linespoints lc 1 title "f32 KV, tiles", \
     '' using 1:4 with linespoints dt 2 lc 2 title "f16 KV, before", \
     '' using 1:5 with linespoints lc 2 title "f16 KV, tiles"
