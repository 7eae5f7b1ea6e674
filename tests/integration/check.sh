# check.sh - TAP-style checks for the shell integration tests, how such a
# test skips, and its private servers (sourced by install_test.sh and
# swarmctl_secrets_test.sh, and through managed.sh by the tests of a
# managed swarm).
#
# The sourcing script sets $out (a file for a command's output); n and
# failures count the checks and the failed ones.

n=0
failures=0

# pick_port: a free 127.0.0.1 port below the kernel's ephemeral range, for
# a server a test starts (a port from bind(0) is in that range, where an
# outgoing connection can take it before the server binds).
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/port.sh"

# check NAME EXPECTED_RC PATTERN... -- CMD...: runs CMD (stdout+stderr to
# $out), checks its exit status and that every PATTERN (grep -E) occurs.
# Returns 0 when both hold.
check() {
	local name=$1 want=$2 rc ok=1
	shift 2
	local pats=()
	while [ "$1" != -- ]; do
		pats+=("$1")
		shift
	done
	shift
	n=$((n + 1))
	"$@" >"$out" 2>&1
	rc=$?
	if [ "$rc" != "$want" ]; then
		ok=0
		echo "not ok $n - $name: exit $rc, expected $want"
	fi
	for p in "${pats[@]}"; do
		if ! grep -Eq -- "$p" "$out"; then
			[ $ok = 1 ] && echo "not ok $n - $name"
			ok=0
			echo "#   missing: $p"
		fi
	done
	if [ $ok = 1 ]; then
		echo "ok $n - $name"
	else
		failures=$((failures + 1))
		sed 's/^/#   | /' "$out" | tail -n 40
	fi
	return $((1 - ok))
}

# ok NAME CMD...: one check that CMD succeeds (its output not captured).
ok() {
	local name=$1
	shift
	n=$((n + 1))
	if "$@"; then
		echo "ok $n - $name"
	else
		echo "not ok $n - $name"
		failures=$((failures + 1))
	fi
}

# skip_or_fail REASON: a server the test needs is missing: exit 77 (skip)
# on a developer machine, 1 under CI=true.
skip_or_fail() {
	if [ "${CI:-}" = true ]; then
		echo "FAIL: $* (CI=true: a missing server is a failure)"
		exit 1
	fi
	echo "SKIP: $*"
	exit 77
}

# private_servers SRV ERRFILE: starts a private Redis and PostgreSQL under
# the directory SRV (scripts/lib/test-servers.sh, stopped when this shell
# exits), loads their URLs (SWARM_TEST_REDIS_URL, SWARM_TEST_PG_URL) and
# sets rport and pgport from them; skips (fails under CI=true) when they
# do not start, after printing ERRFILE (their start-up errors). Needs
# $root, the project root.
private_servers() {
	local srv=$1 errfile=$2
	if ! "$root/scripts/lib/test-servers.sh" start -o $$ -s redis,pg "$srv" >/dev/null 2>"$errfile"; then
		cat "$errfile"
		skip_or_fail "private Redis/PostgreSQL did not start"
	fi
	. "$srv/env"
	rport=${SWARM_TEST_REDIS_URL##*:}
	pgport=${SWARM_TEST_PG_URL##*:}
	pgport=${pgport%%/*}
}
