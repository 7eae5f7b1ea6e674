# bench/lib.sh - what the bench scripts that start a server share (sourced).

# bench_scratch NAME: $tmp, a new folder /tmp/swarm-NAME.XXXXXX, and $pid,
# the server the script starts (empty until then); at exit the server is
# stopped (bench_stop) and the folder removed.
bench_scratch() {
	tmp=$(mktemp -d "/tmp/swarm-$1.XXXXXX")
	pid=
	trap 'bench_stop; rm -rf "$tmp"' EXIT
}

# bench_stop: SIGTERM to the server $pid if it runs, and wait for it;
# $pid is empty after.
bench_stop() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	pid=
}
