# gnuplot start-2026-12-05.gp (from its folder): bench/start_ab.sh's runs
set terminal pngcairo size 900,420 font "sans,10" noenhanced
set output "start-2026-12-05.png"
set title "gpud serve start-up, 2 cpu devices, 3B-shaped Q8_0 (2.8 GiB), 2 CPUs: exec to warm-up done"
set xlabel "round (base and new alternated, base first in odd rounds)"
set ylabel "seconds"
set yrange [0:*]
set xrange [0.5:6.5]
set xtics 1
set key top right
set style fill solid 0.8 border -1
set boxwidth 0.35
plot "< awk '$1==\"base\"' start-2026-12-05.dat" using ($2-0.18):3 with boxes lc rgb "#adb5bd" title "base (engines one after another)", \
     "< awk '$1==\"new\"' start-2026-12-05.dat" using ($2+0.18):3 with boxes lc rgb "#2a9d8f" title "new (engines side by side)", \
     "< awk '$1==\"base\"' start-2026-12-05.dat" using ($2-0.18):4 with points pt 7 lc rgb "#333333" title "reserve phase (gpud's own figure)", \
     "< awk '$1==\"new\"' start-2026-12-05.dat" using ($2+0.18):4 with points pt 7 lc rgb "#333333" notitle
