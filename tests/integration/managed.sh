# managed.sh - what the tests of a managed swarm (swarmctl_test.sh,
# swarmctl_heal_test.sh) share: the servers `swarmctl start` runs must be
# installed, and whatever a state directory still runs is stopped at the
# end.
#
# It sources check.sh and sets $samples (the documents the tests submit,
# relative to the project root); the sourcing script sets $swarmctl (the
# binary under test).

. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
samples=docs/samples

# need_managed_servers: skips (fails under CI=true) unless redis-server,
# PostgreSQL's server binaries (SWARM_PG_BINDIR, else the newest under
# /usr/lib/postgresql) and pgvector are installed; fails unless run from
# the project root.
need_managed_servers() {
	local d sharedir pgbin=''
	command -v redis-server >/dev/null || skip_or_fail "redis-server not installed"
	for d in /usr/lib/postgresql/*/bin; do
		[ -x "$d/initdb" ] && pgbin=$d
	done
	[ -n "${SWARM_PG_BINDIR:-}" ] && pgbin=$SWARM_PG_BINDIR
	[ -n "$pgbin" ] || skip_or_fail "PostgreSQL server binaries not found"
	sharedir=$("$pgbin/pg_config" --sharedir 2>/dev/null || echo /usr/share/postgresql/15)
	[ -f "$sharedir/extension/vector.control" ] || skip_or_fail "pgvector not installed"
	[ -d "$samples" ] || { echo "FAIL: run from the project root ($samples missing)"; exit 1; }
}

# reap DIR: stops whatever the state directory DIR still runs, by its pid
# files only (`swarmctl stop` first, then kill -9 of every pid file's
# process, then PostgreSQL's postmaster).
reap() {
	local dir=$1 f pid
	[ -d "$dir" ] || return 0
	SWARM_STATE_DIR=$dir "$swarmctl" stop >/dev/null 2>&1
	for f in "$dir"/run/*.pid; do
		[ -f "$f" ] || continue
		read -r pid _ <"$f" || continue
		kill -KILL "$pid" 2>/dev/null
	done
	if [ -f "$dir/pg/data/postmaster.pid" ]; then
		read -r pid <"$dir/pg/data/postmaster.pid"
		kill -QUIT "$pid" 2>/dev/null
		sleep 1
		kill -KILL "$pid" 2>/dev/null
	fi
}
