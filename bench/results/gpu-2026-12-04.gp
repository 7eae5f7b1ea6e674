# gnuplot gpu-2026-12-04.gp (from its folder); made by tests/gpu/plot from combined.md
set terminal pngcairo size 1200,480 font "sans,10" noenhanced
set output "gpu-2026-12-04.png"
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
"batch 1" 367.1 236.8
"batch 16" 1204.5 2275.1
"batch 64" 3996.8 7917.6
EOD
$stages << EOD
batch "gate, up" "attention" "attention norm" "down" "ffn norm" "q, k, v" "o" "output" "embedding" "sampling"
"batch 1" 20.52 17.18 14.13 13.60 12.37 9.92 7.68 3.77 0.55 0.28
"batch 16" 28.13 5.54 4.44 20.83 4.00 22.72 9.27 4.73 0.23 0.12
"batch 64" 28.93 6.37 3.32 20.81 3.24 22.16 9.60 5.20 0.21 0.16
EOD
set multiplot layout 1,2
set title "3B-shaped decode on NVIDIA H200: tokens/s, all sequences"
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
set title "3B Q8_0 decode step by stage (kernel profile)"
set style histogram rowstacked
set ylabel "% of the step"
set key outside right top
plot for [i=2:11] $stages using i:xtic(1) title columnheader(i)
unset multiplot
