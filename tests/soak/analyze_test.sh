#!/usr/bin/env bash
# analyze_test.sh - analyze.awk on synthetic series whose answer is known:
# a flat but noisy RSS, a slow leak, a leak under noise larger than the
# leak per window, a process restarted inside the judged interval (only
# its last part is judged), one restarted too late to judge, a series
# falling (never a failure), the tolerance's relative part, and the
# troughs file the plots read; then task.awk's document sizes. Exit 0 when every case gives its answer.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d /tmp/soak-analyze-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0

# Synthetic samples every 5 s over 1200 s. Noise: a deterministic
# pseudo-random sawtooth (what allocator arenas and in-flight work do to
# a peak; troughs see only its floor).
awk 'BEGIN {
	srand(7)
	for (t = 0; t <= 1200; t += 5) {
		noise = int(rand() * 4 * 1048576)           # 0..4 MiB above the floor
		printf "%d pid.flat 100\n", t
		printf "%d rss.flat %d\n", t, 100 * 1048576 + noise
		# 1 KiB/s: 600 KiB over the judged 600 s, under the noise
		printf "%d pid.slow 101\n", t
		printf "%d rss.slow %d\n", t, 100 * 1048576 + noise + 1024 * t
		# 8 KiB/s: 4.7 MiB over 600 s
		printf "%d pid.leak 102\n", t
		printf "%d rss.leak %d\n", t, 100 * 1048576 + noise + 8192 * t
		# leaks until a restart at 700 s, flat afterwards
		printf "%d pid.restart %d\n", t, (t < 700 ? 103 : 203)
		printf "%d rss.restart %d\n", t, (t < 700 ? 50 * 1048576 + 65536 * t : 30 * 1048576) + noise
		# restarted at 1000 s: 200 s of the last process, under half of 600
		printf "%d pid.late %d\n", t, (t < 1000 ? 104 : 204)
		printf "%d rss.late %d\n", t, 30 * 1048576 + noise
		# falls: a cache trimmed, never a failure
		printf "%d pid.fall 105\n", t
		printf "%d rss.fall %d\n", t, 200 * 1048576 - 20000 * t + noise
		# grows with a bounded pool, not with time: 2 MiB while
		# pool.bk (no pid series) touches 40 MiB over 600..1200 s
		printf "%d pid.bk 106\n", t
		pool = (t < 600 ? 0 : (t - 600) / 600 * 40 * 1048576)
		printf "%d pool.bk %d\n", t, pool
		printf "%d unpooled.bk %d\n", t, 60 * 1048576 + pool * 0.05 + noise
		# no pid series: a server-side counter
		printf "%d used_memory.redis_nopid %d\n", t, 2000000 + (t % 15) * 1000
	}
}' >"$tmp/samples"

# One line per series: SERIES VERDICT ...; prints VERDICT of $1.
analyze() {
	awk -v from=600 -v to=1200 -v window=60 -v check="$1" -v tol="$2" \
		-v troughs="${3:-}" -f "$here/analyze.awk" "$tmp/samples"
}

expect() { # SERIES TOL WANT [what it shows]
	local got
	got=$(analyze "^$1\$" "$2" | cut -f2)
	if [ "$got" = "$3" ]; then
		echo "ok   $1 ($2): $3${4:+ - $4}"
	else
		echo "FAIL $1 ($2): got '$got', want $3${4:+ - $4}"
		analyze "^$1\$" "$2"
		fails=$((fails + 1))
	fi
}

abs1m="rss.=1048576:0"
expect rss.flat "$abs1m" ok "4 MiB of noise, a flat floor"
expect rss.slow "$abs1m" ok "600 KiB over the span, under the 1 MiB tolerance"
expect rss.slow "rss.=262144:0" RISING "the same leak against 256 KiB"
expect rss.leak "$abs1m" RISING "8 KiB/s"
expect rss.leak "rss.=1048576:0.05" ok "4.7 MiB is under 5% of ~105 MiB"
expect rss.leak "rss.=1048576:0.05,rss.leak=1048576:0.01" RISING "the longer prefix wins"
expect rss.restart "$abs1m" ok "leaked until a restart at 700 s, flat after"
expect rss.late "$abs1m" SHORT "restarted at 1000 s: 200 s left of 600"
expect rss.fall "$abs1m" ok "falling"
expect unpooled.bk "unpooled.=1048576:0" RISING "2 MiB against 1 MiB"
expect unpooled.bk "unpooled.=1048576:0:pool.bk:0.1" ok "plus 10% of the pool's 40 MiB"
expect unpooled.bk "unpooled.=1048576:0:pool.bk:0.01" RISING "plus 1% of it"
expect used_memory.redis_nopid "used_memory.=262144:0" ok "no pid series: one process"

# Restarts are counted; the slope of the leak is about 8192 B/s.
line=$(analyze '^rss\.(restart|leak)$' "$abs1m")
restarts=$(awk -F'\t' '$1 == "rss.restart" { print $8 }' <<<"$line")
slope=$(awk -F'\t' '$1 == "rss.leak" { print ($5 > 7800 && $5 < 8600) ? "near" : $5 }' <<<"$line")
[ "$restarts" = 1 ] && echo "ok   restarts counted: 1" ||
	{ echo "FAIL restarts: '$restarts', want 1"; fails=$((fails + 1)); }
[ "$slope" = near ] && echo "ok   leak slope within 5% of 8192 B/s" ||
	{ echo "FAIL leak slope $slope, want ~8192"; fails=$((fails + 1)); }

# ignore: a series the check names but ignore takes back is not judged.
n=$(awk -v from=600 -v to=1200 -v window=60 -v check='^rss\.' -v ignore='^rss\.leak$' \
	-v tol="$abs1m" -f "$here/analyze.awk" "$tmp/samples" | cut -f1 | grep -c '^rss\.leak$')
[ "$n" = 0 ] && echo "ok   ignore: rss.leak not judged" ||
	{ echo "FAIL ignore: rss.leak judged"; fails=$((fails + 1)); }

# Exit status: 1 when any judged series is not ok.
if analyze '^rss\.(flat|leak)$' "$abs1m" >/dev/null; then
	echo "FAIL exit status 0 with a RISING series"
	fails=$((fails + 1))
else
	echo "ok   exit status 1 with a RISING series"
fi

# The troughs file: one per full 60 s window and series (pid.* left
# out), each the window's minimum, and the flat one's at the floor.
analyze '^$' "$abs1m" "$tmp/troughs" >/dev/null
n=$(awk '$1 == "rss.flat"' "$tmp/troughs" | wc -l)
pids=$(awk '$1 ~ /^pid\./' "$tmp/troughs" | wc -l)
high=$(awk '$1 == "rss.flat" && $3 > 100 * 1048576 + 2 * 1048576' "$tmp/troughs" | wc -l)
if [ "$n" -ge 19 ] && [ "$n" -le 21 ] && [ "$pids" = 0 ] && [ "$high" = 0 ]; then
	echo "ok   troughs file: $n windows of rss.flat, all near its floor"
else
	echo "FAIL troughs file: $n windows, $pids pid lines, $high far above the floor"
	fails=$((fails + 1))
fi

# task.awk's documents: within --doc-bytes' MIN:MAX (an answer's own
# text a quarter of a draw plus MIN), and without them the 1-50 KB of
# the runs before the option, draw for draw (seed 5's first task).
task() { # N DOC_MIN DOC_MAX: the first line, "CLASS KIND BYTES"
	awk -v seed=5 -v n="$1" -v prefix=t -v doc_mode=text -v doc_id=1 -v max_tokens=16 \
		-v mix=40:25:30:5 -v doc_min="$2" -v doc_max="$3" -f "$here/task.awk" | head -n 1
}
first=$(task 1 "" "")
out=$(for n in $(seq 200); do task "$n" 256 2048; done |
	awk '$1 == "valid" && $3 > 0 { n++; if ($3 < 256 || $3 > ($2 == "answer" ? 256 + 512 : 2048)) bad++ }
		END { print n + 0, bad + 0 }')
if [ "$first" = "valid ingest 32895" ] && [ "${out#* }" = 0 ] && [ "${out% *}" -gt 100 ]; then
	echo "ok   task.awk: seed 5's first draw as before; ${out% *} documents within 256:2048"
else
	echo "FAIL task.awk: first draw \"$first\" (want \"valid ingest 32895\"); documents, out of range: $out"
	fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "analyze_test: all passed" || echo "analyze_test: $fails failed"
[ "$fails" -eq 0 ]
