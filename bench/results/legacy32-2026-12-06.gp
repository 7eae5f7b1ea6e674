# gnuplot legacy32-2026-12-06.gp (from its folder): bench/legacy32.sh's medians
set terminal pngcairo size 1000,420 font "sans,10" noenhanced
set output "legacy32-2026-12-06.png"
set multiplot layout 1,2 title "Qwen2.5-0.5B shape (rows of 896), gpud generate on 2 CPUs (Zen 5 class EPYC): plain AVX2 kernels (87ad729) vs packed + AVX-512 VNNI"
set style fill solid 0.8 border -1
set boxwidth 0.35
set yrange [0:*]
set xrange [0.5:6.5]
set key above
set ylabel "tokens/s (median of 3)"
set xtics ("q8_0" 1, "q4_k_m" 2, "q5_k_m" 3, "q3_k" 4, "q5_0" 5, "q4_1" 6)
set title "prefill, 349-token prompt"
plot "legacy32-2026-12-06.dat" using ($2-0.18):3 with boxes lc rgb "#adb5bd" title "plain", \
     "" using ($2+0.18):4 with boxes lc rgb "#2a9d8f" title "packed"
set title "decode, 64 tokens after it"
plot "legacy32-2026-12-06.dat" using ($2-0.18):5 with boxes lc rgb "#adb5bd" title "plain", \
     "" using ($2+0.18):6 with boxes lc rgb "#2a9d8f" title "packed"
unset multiplot
