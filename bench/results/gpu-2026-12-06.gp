# gnuplot gpu-2026-12-06.gp (from its folder); made by tests/gpu/plot from b.md
set terminal pngcairo size 1200,480 font "sans,10" noenhanced
set output "gpu-2026-12-06.png"
set linetype 1 lc rgb "#7b2cbf"
set linetype 2 lc rgb "#2a9d8f"
set linetype 3 lc rgb "#8ecae6"
set linetype 4 lc rgb "#e9c46a"
set linetype 5 lc rgb "#f4a261"
set linetype 6 lc rgb "#219ebc"
set linetype 7 lc rgb "#e63946"
set linetype 8 lc rgb "#333333"
set linetype 9 lc rgb "#90be6d"
set linetype 10 lc rgb "#b5838d"
set linetype 11 lc rgb "#6d597a"
set linetype 12 lc rgb "#ffb703"
set linetype 13 lc rgb "#023047"
set linetype 14 lc rgb "#c1121f"
set linetype 15 lc rgb "#adb5bd"
set linetype 16 lc rgb "#606c38"
$rates << EOD
"batch 1" 435.2 275.6
"batch 2" 775.1 486.5
"batch 16" 3336.1 2140.6
"batch 64" 8039.5 7752.5
EOD
$stages << EOD
batch "gate, up" "q, k, v" "down" "attention" "o" "output" "sampling" "embedding" "ffn norm" "attention norm"
"batch 1" 31.25 20.26 18.55 14.52 8.64 6.44 0.19 0.15 0.00 0.00
"batch 16" 29.50 19.98 18.10 9.66 11.52 5.21 0.16 0.07 2.90 2.90
"batch 64" 25.29 20.61 21.35 11.92 12.89 3.94 0.27 0.05 1.82 1.84
EOD
set multiplot layout 1,2
set title "3B-shaped decode on NVIDIA H100 80GB HBM3: tokens/s, all sequences"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "tokens/s (log scale)"
set logscale y
set yrange [1:*]
set key top left
plot $rates using 2:xtic(1) title "Q8_0", '' using 3 title "F16"
unset logscale y
set yrange [0:100]
set title "3B Q8_0 decode step by stage (each launch in a graph of its own)"
set style histogram rowstacked
set ylabel "% of the step"
set key outside right top
plot for [i=2:11] $stages using i:xtic(1) title columnheader(i)
unset multiplot
