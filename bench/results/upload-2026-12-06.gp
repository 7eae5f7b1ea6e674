set terminal pngcairo size 800,450 noenhanced
set output 'bench/results/upload-2026-12-06.png'
set title 'CUDA upload: host packing of the replica (requantizing to Q8_0)'
set style data histograms
set style histogram cluster gap 1
set style fill solid 0.8
set ylabel 'seconds (best of 3)'
set xlabel 'threads'
set key top right
plot for [m in "3b-q4_k_m q05-q4_k_m 3b-q8_0"] '< grep "^'.m.' " bench/results/upload-2026-12-06.dat' using 3:xtic(2) title m
