# gnuplot bench/results/kv-2026-12-03.gp (from bench/results/)
# Data: kv-2026-12-03.dat (kv-2026-12-03-before.dat: the run before attend()'s
# KV prefetch, gray), written by bench_kv --dat; block 0 is B=1,
# block 1 is B=8 (B=8 stops at L 4096: prefilling 8 x 8192 takes too long
# on 2 cores). Columns: L, f32 best, f16 best, f32 mean, f16 mean, B.
set terminal pngcairo size 1000,420 font "sans,10" noenhanced
set output "kv-2026-12-03.png"
set datafile columnheaders
set logscale x 2
set xrange [200:10000]
set xtics (256, 1024, 2048, 4096, 8192)
set xlabel "context length L (positions in the KV cache)"
set grid ytics
set key top right
set multiplot layout 1,2 title "Decode on 2 CPUs: Llama-3.2-3B attention (24 heads, 8 KV heads, head_dim 128), 2 layers, Q8_0"
set title "aggregate decode tokens/s (mean over the timed steps)"
set ylabel "decode tokens/s"
set logscale y 2
plot "kv-2026-12-03.dat" index 0 using 1:4 with linespoints lw 2 pt 7 lc rgb "#1f77b4" title "f32 KV, 1 sequence", \
     "" index 0 using 1:5 with linespoints lw 2 pt 5 lc rgb "#ff7f0e" title "f16 KV, 1 sequence", \
     "" index 1 using 1:4 with linespoints lw 2 dt 2 pt 6 lc rgb "#1f77b4" title "f32 KV, 8 sequences", \
     "" index 1 using 1:5 with linespoints lw 2 dt 2 pt 4 lc rgb "#ff7f0e" title "f16 KV, 8 sequences", \
     "kv-2026-12-03-before.dat" index 0 using 1:4 with linespoints lw 1 pt 7 lc rgb "#aaaaaa" title "f32 KV, 1 sequence, before the KV prefetch", \
     "" index 1 using 1:4 with linespoints lw 1 dt 2 pt 6 lc rgb "#aaaaaa" title "f32 KV, 8 sequences, before"
unset logscale y
set title "f16 KV / f32 KV decode speed (means; steps taken in turn)"
set ylabel "speed-up of f16 KV"
set yrange [0.8:1.3]
set key top left
plot 1 with lines lc rgb "gray" notitle, \
     "kv-2026-12-03.dat" index 0 using 1:($5/$4) with linespoints lw 2 pt 7 lc rgb "#2ca02c" title "1 sequence", \
     "" index 1 using 1:($5/$4) with linespoints lw 2 dt 2 pt 6 lc rgb "#2ca02c" title "8 sequences", \
     "kv-2026-12-03-before.dat" index 0 using 1:($5/$4) with linespoints lw 1 pt 7 lc rgb "#aaaaaa" title "1 sequence, before the KV prefetch", \
     "" index 1 using 1:($5/$4) with linespoints lw 1 dt 2 pt 6 lc rgb "#aaaaaa" title "8 sequences, before"
unset multiplot
