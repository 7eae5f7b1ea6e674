#!/usr/bin/env bash
# bench/start_ab.sh - gpud serve's start-up, two builds alternated: the
# seconds from exec to "warm-up done" (ready to serve) and the reserve
# phase gpud reports itself ("pools backed at once ... in S s": the
# engines and the other pools), over N_DEV devices of one kind.
#
#   bench/start_ab.sh BASE_GPUD NEW_GPUD MODEL [ROUNDS [N_DEV [KIND]]]
#
# KIND is cpu (default) or cuda (cuda:0 .. cuda:N_DEV-1). Each round runs
# base then new (odd rounds) or new then base (even rounds), each once,
# and stops it (SIGTERM) before the next starts; the model file is read
# once before the first run, so that every run finds it in the page
# cache. Prints a markdown row per run and the medians; RAW=FILE keeps
# the rows as "build round ready_s reserve_s" for a plot.
set -euo pipefail

usage="usage: BASE_GPUD NEW_GPUD MODEL [ROUNDS [N_DEV [KIND]]]"
base=$(realpath "${1:?$usage}")
new=$(realpath "${2:?$usage}")
model=$(realpath "${3:?$usage}")
rounds=${4:-3}
ndev=${5:-2}
kind=${6:-cpu}
case $kind in cpu | cuda) ;; *) echo "bench/start_ab.sh: KIND is cpu or cuda" >&2; exit 2 ;; esac

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_scratch start

devs=
for i in $(seq 0 $((ndev - 1))); do
	if [ "$kind" = cpu ]; then d='"cpu"'; else d="\"cuda:$i\""; fi
	devs=${devs:+$devs, }$d
done
cat >"$tmp/gpud.json" <<JSON
{ "state_dir": "$tmp", "gpud": { "model": "$model", "socket": "$tmp/g.sock",
  "devices": [$devs], "max_seqs": 8 } }
JSON
cat "$model" >/dev/null # in the page cache for every run

# one start: sets ready (seconds) and reserve (gpud's figure, or nan)
one() {
	local bin=$1 log=$tmp/log t0 t1
	: >"$log"
	t0=$(date +%s.%N)
	"$bin" serve --config "$tmp/gpud.json" >"$log" 2>&1 &
	pid=$!
	while ! grep -q "warm-up done" "$log"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "bench/start_ab.sh: $bin exited before it was ready:" >&2
			tail -5 "$log" >&2
			exit 1
		fi
		sleep 0.05
	done
	t1=$(date +%s.%N)
	reserve=$(sed -n 's/.*pools backed at once .* in \([0-9.]*\) s.*/\1/p' "$log" | head -1)
	reserve=${reserve:-nan}
	bench_stop
	ready=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
}

echo "gpud serve start-up, $ndev $kind device(s), $(basename "$model"); $(nproc) CPUs"
echo
echo "| round | build | exec to warm-up done (s) | reserve phase (s) |"
echo "|---:|---|---:|---:|"
: >"$tmp/raw"
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
	for b in $order; do
		if [ "$b" = base ]; then bin=$base; else bin=$new; fi
		one "$bin"
		printf "| %d | %s | %.2f | %s |\n" "$r" "$b" "$ready" "$reserve"
		echo "$b $r $ready $reserve" >>"$tmp/raw"
	done
done
med() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
for b in base new; do
	echo "$b: median $(awk -v b="$b" '$1 == b { print $3 }' "$tmp/raw" | med) s to ready," \
		"reserve phase $(awk -v b="$b" '$1 == b { print $4 }' "$tmp/raw" | med) s"
done
[ -n "${RAW:-}" ] && cp "$tmp/raw" "$RAW"
exit 0
