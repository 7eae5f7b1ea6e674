#!/usr/bin/env bash
# swarmctl_ports_test.sh - the managed swarm listens on no TCP port beyond
# the ones its configuration asks for (issue 13, DESIGN §6a).
#
#   swarmctl_ports_test.sh SWARMCTL
#
# One managed swarm (redis-server, PostgreSQL with pgvector, gpud on the
# built-in model, agentd and its workers, the supervisor) in a temporary
# state directory, with gpud's metrics endpoint configured on a free
# 127.0.0.1 port (SWARM_GPUD_METRICS). Every process of the tree (the
# supervisor and all its descendants) is collected from /proc, then:
#   - `ss -ltnpH` (TCP, listening, with the owning processes) lists exactly
#     one socket of the tree: gpud's metrics on 127.0.0.1:PORT;
#   - the same from the kernel's tables alone: the LISTEN entries of
#     /proc/net/tcp and /proc/net/tcp6 whose inode is a socket one of the
#     tree's processes holds (/proc/PID/fd), so the check does not rest on
#     ss's process column;
#   - without SWARM_GPUD_METRICS (a second start), no TCP socket at all;
#   - as root, Redis, gpud and agentd run as the user swarm (managed mode's
#     default; swarmctl creates it).
# The metrics port is the positive control: it proves both methods see a
# listening socket of the tree when there is one.
#
# Exit: 0 pass, 1 fail, 77 skip (no redis-server, PostgreSQL or pgvector,
# or no ss, on a developer machine; under CI=true a missing server fails).
set -uo pipefail

swarmctl=$(realpath "${1:?usage: swarmctl_ports_test.sh SWARMCTL}")
. "$(dirname "${BASH_SOURCE[0]}")/managed.sh" # check.sh, $samples
need_managed_servers
command -v ss >/dev/null || skip_or_fail "ss (iproute2) not installed"

top=$(mktemp -d /tmp/swarmports-it.XXXXXX)
chmod 755 "$top" # PostgreSQL runs as postgres when we are root
state=$top/s
out=$top/out

unset SWARM_MODEL SWARM_CONFIG SWARM_GPUD_METRICS SWARM_USER
# the HTTP front off (swarmctl_http_test.sh covers it): these cases are about the
# other services, and a fixed port 8080 would clash between concurrent runs
export SWARM_HTTP_LISTEN=
export SWARM_STATE_DIR=$state SWARM_WORKERS=2

cleanup() {
	reap "$state"
	rm -rf "$top"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ctl() { "$swarmctl" "$@"; }

# tree_pids: the supervisor and every descendant, one pid a line.
tree_pids() {
	local sup
	read -r sup _ <"$state/run/supervisor.pid" || return 1
	# pid ppid of every process (the comm field may hold blanks: cut
	# after its closing parenthesis)
	for f in /proc/[0-9]*/stat; do
		s=$(cat "$f" 2>/dev/null) || continue
		rest=${s##*) }
		set -- $rest
		echo "${f//[^0-9]/} $2"
	done | awk -v root="$sup" '
		{ parent[$1] = $2 }
		END {
			keep[root] = 1; changed = 1
			while (changed) {
				changed = 0
				for (p in parent)
					if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 }
			}
			for (p in keep) print p
		}'
}

# ss_listeners PIDS_FILE: "ADDR:PORT name" for each listening TCP socket
# that ss attributes to a process in PIDS_FILE.
ss_listeners() {
	ss -ltnpH | awk -v pidf="$1" '
		BEGIN { while ((getline p < pidf) > 0) mine[p] = 1 }
		{
			line = $0
			while (match(line, /"[^"]*",pid=[0-9]+/)) {
				m = substr(line, RSTART, RLENGTH)
				line = substr(line, RSTART + RLENGTH)
				name = m; sub(/^"/, "", name); sub(/",pid=.*/, "", name)
				pid = m; sub(/.*pid=/, "", pid)
				if (pid in mine) { print $4, name; break }
			}
		}' | sort -u
}

# proc_listeners PIDS_FILE: "ADDR:PORT" (hex, as the kernel writes it) for
# each LISTEN socket in /proc/net/tcp{,6} whose inode a process in
# PIDS_FILE holds.
proc_listeners() {
	local p
	while read -r p; do
		ls -l "/proc/$p/fd" 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]$/\1/p'
	done <"$1" | sort -u >"$top/inodes"
	# st 0A is TCP_LISTEN; field 10 is the inode
	cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v inf="$top/inodes" '
		BEGIN { while ((getline i < inf) > 0) mine[i] = 1 }
		$4 == "0A" && ($10 in mine) { print $2 }' | sort -u
}

# hexaddr PORT: 127.0.0.1:PORT as /proc/net/tcp writes it.
hexaddr() { printf '0100007F:%04X\n' "$1"; }

# --- with a metrics endpoint -------------------------------------------------
port=$(pick_port) || { echo "FAIL: no free port"; exit 1; }
check "start with metrics on 127.0.0.1:$port" 0 "swarm is running" \
	-- env SWARM_GPUD_METRICS="127.0.0.1:$port" "$swarmctl" start || exit 1

tree_pids >"$top/pids"
ok "the process tree holds the services and the workers (>= 6 processes)" \
	test "$(wc -l <"$top/pids")" -ge 6
for f in redis gpud agentd; do
	read -r pid _ <"$state/run/$f.pid"
	ok "$f (pid $pid) is in the supervisor's tree" grep -qx "$pid" "$top/pids"
done
read -r pgpid <"$state/pg/data/postmaster.pid"
ok "the postmaster (pid $pgpid) is in the supervisor's tree" grep -qx "$pgpid" "$top/pids"
if [ "$(id -u)" = 0 ]; then
	# started by root: the services run as the dedicated user swarm
	for f in redis gpud agentd; do
		read -r pid _ <"$state/run/$f.pid"
		ok "as root, $f runs as the user swarm" \
			test "$(awk '/^Uid:/ { print $2 $3 $4 $5 }' "/proc/$pid/status")" = \
			"$(id -u swarm)$(id -u swarm)$(id -u swarm)$(id -u swarm)"
	done
fi

ss_listeners "$top/pids" >"$top/ss"
n=$((n + 1))
if [ "$(cat "$top/ss")" = "127.0.0.1:$port gpud" ]; then
	echo "ok $n - ss: the tree listens on TCP only at gpud's metrics, 127.0.0.1:$port"
else
	echo "not ok $n - ss: the tree's listening TCP sockets are not just 127.0.0.1:$port (gpud)"
	sed 's/^/#   | /' "$top/ss"
	ss -ltnpH | sed 's/^/#   ss: /'
	failures=$((failures + 1))
fi

proc_listeners "$top/pids" >"$top/proc"
n=$((n + 1))
if [ "$(cat "$top/proc")" = "$(hexaddr "$port")" ]; then
	echo "ok $n - /proc/net/tcp{,6}: the tree's only listening TCP socket is $(hexaddr "$port")"
else
	echo "not ok $n - /proc/net/tcp{,6}: the tree listens on more than $(hexaddr "$port")"
	sed 's/^/#   | /' "$top/proc"
	failures=$((failures + 1))
fi

check "stop" 0 "" -- ctl stop

# --- without: no TCP socket at all -------------------------------------------
check "start without metrics" 0 "swarm is running" -- ctl start || exit 1
tree_pids >"$top/pids"
ss_listeners "$top/pids" >"$top/ss"
proc_listeners "$top/pids" >"$top/proc"
n=$((n + 1))
if [ ! -s "$top/ss" ] && [ ! -s "$top/proc" ] && [ "$(wc -l <"$top/pids")" -ge 6 ]; then
	echo "ok $n - no process of the tree listens on TCP (ss and /proc agree)"
else
	echo "not ok $n - the tree listens on TCP without any port configured"
	sed 's/^/#   ss | /' "$top/ss"
	sed 's/^/#   proc | /' "$top/proc"
	failures=$((failures + 1))
fi
check "stop again" 0 "" -- ctl stop

echo "1..$n"
[ "$failures" = 0 ] || { echo "FAIL: $failures of $n"; exit 1; }
echo "PASS: $n checks"
