# check.sh - TAP-style checks for the shell integration tests, and how
# such a test skips (sourced by install_test.sh, and through managed.sh by
# swarmctl_test.sh and swarmctl_heal_test.sh).
#
# The sourcing script sets $out (a file for a command's output); n and
# failures count the checks and the failed ones.

n=0
failures=0

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
