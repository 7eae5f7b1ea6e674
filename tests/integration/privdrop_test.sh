#!/usr/bin/env bash
# privdrop_test.sh - gpud and agentd started as root with `user` set run
# as that user (issue 13, common/privdrop.h).
#
#   privdrop_test.sh SWARMCTL
#
# As root, with private Redis (requirepass) and PostgreSQL
# (scripts/lib/test-servers.sh) and a config whose `user` is nobody and
# whose Redis password is in a root-owned 0600 file:
#   - an unknown user: gpud and agentd refuse to start, naming it;
#   - started as another non-root user: refused ("not root: cannot switch");
#   - gpud serve and agentd (two workers) started as root: every uid and
#     gid in /proc/PID/status (real, effective, saved, filesystem) is
#     nobody's, no supplementary group is root's, gpud's socket belongs to
#     nobody; the workers, which cannot read the root-only password file,
#     reach Redis with the password their supervisor read (the ingest of a
#     document completes, through Redis, gpud and PostgreSQL);
#   - managed mode started by root with SWARM_USER= (all root, as before),
#     then with SWARM_USER set to a user that
#     does not exist: swarmctl creates it (a system user, as PostgreSQL's
#     package does), runs Redis, gpud, agentd and the workers as it
#     (PostgreSQL as postgres), takes over root's files of the first run
#     (gpud rewrites its block-owner dump), and a summarize completes; the user is
#     removed again at the end.
#
# Exit: 0 pass, 1 fail, 77 skip (not root, no nobody user, or servers
# missing on a developer machine; under CI=true a missing server fails).
set -uo pipefail

swarmctl=$(realpath "${1:?usage: privdrop_test.sh SWARMCTL}")
. "$(dirname "${BASH_SOURCE[0]}")/managed.sh" # check.sh, reap
root=$(pwd)
bindir=$(dirname "$swarmctl")/..
gpud=$(realpath "$bindir/gpud/gpud")
agentd=$(realpath "$bindir/agentd/agentd")
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
id nobody >/dev/null 2>&1 || skip_or_fail "no user nobody"
command -v redis-cli >/dev/null && command -v psql >/dev/null || skip_or_fail "redis-cli or psql missing"
uname=nobody
uid=$(id -u nobody)
gid=$(id -g nobody)

top=$(mktemp -d /tmp/privdrop-it.XXXXXX)
chmod 755 "$top"
srv=$top/srv
mkdir "$srv"
out=$top/out
cfg=$top/swarm.json
gpid= apid=

muser=swarm-it-$$
mstate=$top/m
cleanup() {
	reap "$mstate"
	id "$muser" >/dev/null 2>&1 && userdel "$muser" 2>/dev/null
	[ -n "$apid" ] && kill -TERM "$apid" 2>/dev/null && sleep 2 && kill -KILL "$apid" 2>/dev/null
	[ -n "$gpid" ] && kill -KILL "$gpid" 2>/dev/null
	"$root/scripts/lib/test-servers.sh" stop "$srv" >/dev/null 2>&1
	rm -rf "$top"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
unset SWARM_REDIS_PASSWORD SWARM_PG_PASSWORD SWARM_CONFIG SWARM_USER SWARM_STATE_DIR
export SWARM_HTTP_LISTEN= # managed mode without the HTTP front (swarmctl_http_test.sh)

private_servers "$srv" "$top/srv.err"
rpw="pd-$RANDOM$RANDOM"
redis-cli -p "$rport" CONFIG SET requirepass "$rpw" >/dev/null
psql -X -q -v ON_ERROR_STOP=1 "$SWARM_TEST_PG_URL" -c "CREATE DATABASE privdrop_it" &&
	psql -X -q "postgresql://postgres@127.0.0.1:$pgport/privdrop_it" -c "CREATE EXTENSION vector" ||
	{ echo "FAIL: database"; exit 1; }

"$gpud" mkmodel --out "$top/m.gguf" --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 \
	--vocab byte --type q8_0 --seed 7 --context 2048 --name privdrop-it >"$top/mk.log" 2>&1 ||
	{ cat "$top/mk.log"; echo "FAIL: mkmodel"; exit 1; }
chmod 644 "$top/m.gguf"
printf '%s\n' "$rpw" >"$top/redis.pw"
chmod 600 "$top/redis.pw" # root's: nobody cannot read it
mkdir -m 755 "$top/run" "$top/state"
chown nobody "$top/run" "$top/state"

# write_cfg USER
write_cfg() {
	cat >"$cfg" <<-EOF
	{ "state_dir": "$top/state", "user": "$1",
	  "redis": { "url": "redis://127.0.0.1:$rport/0", "password_file": "$top/redis.pw" },
	  "postgres": { "url": "postgresql://postgres@127.0.0.1:$pgport/privdrop_it" },
	  "gpud": { "socket": "$top/run/g.sock", "model": "$top/m.gguf", "threads": 1,
	            "prefix_cache_bytes": 0, "kv_blocks": 256, "max_seqs": 8 },
	  "agentd": { "workers": 2 } }
	EOF
	chmod 644 "$cfg"
}

# --- refusals ----------------------------------------------------------------
write_cfg no-such-user-xyz
check "gpud: an unknown user is refused, named" 1 "user no-such-user-xyz: no such user" \
	-- "$gpud" serve --config "$cfg"
check "agentd: an unknown user is refused, named" 1 "user no-such-user-xyz: no such user" \
	-- "$agentd" --config "$cfg"
write_cfg root
chmod 644 "$cfg"
check "started as nobody with user root: refused (not root, cannot switch)" 1 \
	"started as uid $uid, not root: cannot switch to user root" \
	-- env SWARM_REDIS_PASSWORD=x setpriv --reuid="$uid" --regid="$gid" --clear-groups \
	"$gpud" serve --config "$cfg"

# --- as root with user nobody ------------------------------------------------
write_cfg nobody
"$gpud" serve --config "$cfg" >"$top/gpud.log" 2>&1 &
gpid=$!
for _ in $(seq 1 300); do
	[ -S "$top/run/g.sock" ] && break
	kill -0 "$gpid" 2>/dev/null || break
	sleep 0.2
done
ok "gpud is up (its socket exists)" test -S "$top/run/g.sock"
"$agentd" --config "$cfg" >"$top/agentd.log" 2>&1 &
apid=$!
workers=
for _ in $(seq 1 150); do
	workers=$(pgrep -P "$apid" | tr '\n' ' ')
	[ "$(echo $workers | wc -w)" -ge 2 ] && break
	sleep 0.2
done
ok "agentd runs 2 workers" test "$(echo $workers | wc -w)" -ge 2

# ids PID: checks Uid/Gid (real, effective, saved, fs) and Groups of PID.
ids() {
	local p=$1 name=$2 u g grp
	u=$(awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$p/status")
	g=$(awk '/^Gid:/ { print $2, $3, $4, $5 }' "/proc/$p/status")
	grp=$(awk '/^Groups:/ { $1 = ""; print }' "/proc/$p/status")
	n=$((n + 1))
	if [ "$u" = "$uid $uid $uid $uid" ] && [ "$g" = "$gid $gid $gid $gid" ] &&
		! echo " $grp " | grep -q ' 0 '; then
		echo "ok $n - $name (pid $p) runs as $uname: Uid $u, Gid $g, Groups$grp"
	else
		echo "not ok $n - $name (pid $p): Uid $u, Gid $g, Groups$grp"
		failures=$((failures + 1))
	fi
}
ids "$gpid" gpud
ids "$apid" "agentd supervisor"
for w in $workers; do ids "$w" "agentd worker"; done
ok "gpud's socket belongs to nobody" test "$(stat -c %u "$top/run/g.sock")" = "$uid"
ok "the logs say so" grep -q "running as user nobody (uid $uid, gid $gid)" "$top/gpud.log" "$top/agentd.log"

check "an ingest completes through the dropped workers (Redis password from the root-only file)" 0 \
	"completed" -- "$swarmctl" --config "$cfg" submit \
	docs/samples/sourdough.txt --kind ingest --wait --timeout 300
ok "no worker crashed (none failed on the password file)" \
	sh -c "test -f '$top/state/agentd.status.json' && ! grep -q 'Permission denied' '$top/agentd.log' &&
		! grep -Eq '\"crashes\": ?[1-9]' '$top/state/agentd.status.json'"

kill -TERM "$apid" "$gpid"
wait "$apid" "$gpid" 2>/dev/null
apid= gpid=

# --- managed mode as root with a service user it creates ----------------------
swarmctl=$(realpath "$swarmctl")
need_managed_servers
ok "the user $muser does not exist yet" sh -c "! id $muser >/dev/null 2>&1"
# first all root (SWARM_USER=), as before this user existed: the state
# directory then holds root's files the service user must take over
check "managed start with SWARM_USER= (all root)" 0 "swarm is running" \
	-- env SWARM_STATE_DIR="$mstate" SWARM_USER= SWARM_WORKERS=2 "$swarmctl" start
read -r pid _ <"$mstate/run/gpud.pid"
ok "... gpud runs as root" test "$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")" = 0
check "... gpud writes a block-owner dump" 0 "" -- env SWARM_STATE_DIR="$mstate" "$swarmctl" mem --dump
check "... stop" 0 "" -- env SWARM_STATE_DIR="$mstate" "$swarmctl" stop
check "managed start with SWARM_USER=$muser" 0 "swarm is running" \
	-- env SWARM_STATE_DIR="$mstate" SWARM_USER="$muser" SWARM_WORKERS=2 "$swarmctl" start
ok "swarmctl created the user $muser" id "$muser"
uname=$muser
uid=$(id -u "$muser")
gid=$(id -g "$muser")
for f in redis gpud agentd; do
	read -r pid _ <"$mstate/run/$f.pid"
	ids "$pid" "managed $f"
done
read -r pid _ <"$mstate/run/agentd.pid"
for w in $(pgrep -P "$pid"); do ids "$w" "managed agentd worker"; done
read -r pgpid <"$mstate/pg/data/postmaster.pid"
ok "PostgreSQL still runs as postgres" test "$(awk '/^Uid:/ { print $2 }' "/proc/$pgpid/status")" = "$(id -u postgres)"
check "managed, as $muser: a summarize completes" 0 "completed" \
	-- env SWARM_STATE_DIR="$mstate" "$swarmctl" submit docs/samples/sourdough.txt --wait \
	--max-tokens 4 --timeout 300
check "managed, as $muser: gpud rewrites root's block-owner dump" 0 "" \
	-- env SWARM_STATE_DIR="$mstate" "$swarmctl" mem --dump
ok "... now the user's" sh -c "ls '$mstate'/gpud-blocks-*.json >/dev/null &&
	test -z \"\$(find '$mstate' -maxdepth 1 -name 'gpud-blocks-*.json' ! -user $muser)\""
check "managed stop" 0 "" -- env SWARM_STATE_DIR="$mstate" "$swarmctl" stop

echo "1..$n"
[ "$failures" = 0 ] || { echo "FAIL: $failures of $n"; grep -n "Permission denied\|exit" "$top/agentd.log" | head; exit 1; }
echo "PASS: $n checks"
