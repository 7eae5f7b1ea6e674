#!/usr/bin/env bash
# args_test.sh - tests/soak/run refuses what it cannot run, before it
# starts anything: each bad command line below must exit 2 with its
# message, and leave no state directory behind. Run by meson (suite unit)
# with SWARM_BUILD_DIR set to the build under test.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run=$here/run
tmp=$(mktemp -d /tmp/soak-args-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0 n=0

# refused WANT ARG...: run exits 2, its stderr holds WANT, and it stopped
# before its first step: it made no report directory (--out, made before
# the state directory and the servers) and logged nothing.
refused() {
	local want=$1 rc
	shift
	n=$((n + 1))
	rm -rf "$tmp/out"
	env "${envs[@]}" "$run" --out "$tmp/out" "$@" </dev/null >"$tmp/stdout" 2>"$tmp/stderr"
	rc=$?
	if [ $rc -ne 2 ] || ! grep -qF -- "$want" "$tmp/stderr"; then
		echo "FAIL: run $* (${envs[*]}): exit $rc, want 2 and \"$want\"; stderr:"
		sed 's/^/    /' "$tmp/stderr"
		fails=$((fails + 1))
	elif [ -e "$tmp/out" ] || [ -s "$tmp/stdout" ]; then
		echo "FAIL: run $*: refused, but only after it had begun (made $tmp/out or logged)"
		fails=$((fails + 1))
	else
		echo "ok: run $* -> $(head -n 1 "$tmp/stderr")"
	fi
}

envs=(SWARM_BUILD_DIR="${SWARM_BUILD_DIR:-build}")
refused "unknown argument --bogus" --bogus
refused "--minutes wants a value" --minutes
refused "--kill wants a value" --seed 1 --kill
refused "--minutes: a number" --minutes ten
refused "--minutes: at least 1" --minutes 0.5
refused "--rate: a number" --rate -1
refused "--rate: a number" --rate 0
refused "--rate: a number" --rate 0.00
refused "--seed: an integer" --seed 12ab
refused "--doc-mode: text or document" --doc-mode pdf
refused "--doc-bytes: MIN:MAX" --doc-bytes 8:100
refused "--doc-bytes: MIN:MAX" --doc-bytes 200:100
refused "--doc-bytes: MIN:MAX" --doc-bytes 16:2000000
refused "--doc-bytes: MIN:MAX" --doc-bytes 100
refused "--max-tokens: 1 to 4096" --max-tokens 0
refused "--max-tokens: 1 to 4096" --max-tokens 5000
refused "--mix: I:S:A:M" --mix 1:2:3
refused "--mix: I:S:A:M" --mix 0:0:0:5
refused "--mix: I:S:A:M" --mix 40:25:30:101
refused "--drain: whole seconds" --drain 1.5
refused "--devices: a comma-separated list" --devices gpu0
refused "--devices: a comma-separated list" --devices cpu,cuda:01
refused "--kill: unknown target nothing" --kill gpud,nothing
refused "--skip: unknown check speed" --skip outcomes,speed
# device failures: only on a cuda:N device of a gpud built on cuemu
refused "--devices must name a cuda:N" --kill device-fault
refused "--devices must name a cuda:N" --kill device-hang --devices cpu
refused "SWARM_GPUD_BIN must be a gpud built on cuemu" --kill device-hang --devices cuda:0
envs+=(SWARM_GPUD_BIN=/bin/true)
refused "SWARM_GPUD_BIN must be a gpud built on cuemu" --kill device-fault --devices cpu,cuda:1
envs=(SWARM_BUILD_DIR="$tmp/no-build")
refused "build first" --minutes 1

if [ $fails -ne 0 ]; then
	echo "$fails of $n refusals wrong"
	exit 1
fi
echo "all $n refusals right"
