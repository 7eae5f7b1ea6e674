# gnuplot plot.gp (in this directory): summary.tsv's medians
set terminal pngcairo size 900,500 noenhanced
set datafile separator "\t"
set key top left
set grid
set logscale x 2
set xlabel "concurrent streams"
set output "throughput.png"
set title "generated tokens/s (median of runs): native protocol vs gpud-http"
set ylabel "tokens/s"
plot "< grep -P '^[0-9]+\tnative\t' summary.tsv" using 1:4 with linespoints title "native", \
     "< grep -P '^[0-9]+\thttp\t' summary.tsv" using 1:4 with linespoints title "http /v1/completions", \
     "< grep -P '^[0-9]+\thttp-chat\t' summary.tsv" using 1:4 with linespoints title "http /v1/chat/completions"
set output "ttft.png"
set title "time to first token, p50 and p99 (median of runs)"
set ylabel "ms"
set logscale y
plot "< grep -P '^[0-9]+\tnative\t' summary.tsv" using 1:5 with linespoints title "native p50", \
     "< grep -P '^[0-9]+\thttp\t' summary.tsv" using 1:5 with linespoints title "http p50", \
     "< grep -P '^[0-9]+\thttp-chat\t' summary.tsv" using 1:5 with linespoints title "http-chat p50", \
     "< grep -P '^[0-9]+\tnative\t' summary.tsv" using 1:6 with linespoints dashtype 2 title "native p99", \
     "< grep -P '^[0-9]+\thttp\t' summary.tsv" using 1:6 with linespoints dashtype 2 title "http p99", \
     "< grep -P '^[0-9]+\thttp-chat\t' summary.tsv" using 1:6 with linespoints dashtype 2 title "http-chat p99"
