# every decode run of the three interleaved A/Bs (x: A/B 1 runs 1-3, A/B 2
# runs 1-5 at 7-11, A/B 3 runs 1-5 at 13-17); data: all-runs.tsv
set terminal pngcairo size 900,480 font ",11" noenhanced
set datafile separator "\t"
set output "runs.png"
set title "3B preset, batch-1 decode, every run (base 00390e5, new this pass)"
set ylabel "tokens/s"
set xlabel "A/B 1 (runs 1-3), A/B 2 (7-11), A/B 3 (13-17)"
set yrange [0:*]
set xrange [0:18]
set grid ytics
set key bottom right
plot "all-runs.tsv" using (strcol(3) eq "base" && strcol(5) eq "q5_k_m" ? $1 : 1/0):6 with points pt 7 ps 1.3 lc rgb "#a020f0" title "q5_k_m base", \
     "" using (strcol(3) eq "new" && strcol(5) eq "q5_k_m" ? $1 : 1/0):6 with points pt 7 ps 1.3 lc rgb "#20a080" title "q5_k_m new", \
     "" using (strcol(3) eq "base" && strcol(5) eq "q4_k_m" ? $1 : 1/0):6 with points pt 5 ps 1.1 lc rgb "#c080f0" title "q4_k_m base", \
     "" using (strcol(3) eq "new" && strcol(5) eq "q4_k_m" ? $1 : 1/0):6 with points pt 5 ps 1.1 lc rgb "#60d0a0" title "q4_k_m new"
