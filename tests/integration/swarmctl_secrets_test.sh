#!/usr/bin/env bash
# swarmctl_secrets_test.sh - passwords in external mode (issue 13): only
# from the environment or a private file the config names, never logged,
# never on a child's command line.
#
#   swarmctl_secrets_test.sh SWARMCTL
#
# Private servers (scripts/lib/test-servers.sh, 127.0.0.1): Redis with
# requirepass, PostgreSQL with a role that must give its password
# (scram-sha-256 in pg_hba.conf). Then, with a config file naming
# redis.password_file and postgres.password_file:
#   - a password file readable by group or others, a missing one, an
#     empty one: refused with the path and the fix, by swarmctl and agentd;
#   - a password inside redis.url or postgres.url of a world-readable
#     config file refused; the same in a 0600 config file accepted;
#   - a wrong password: the error names no password;
#   - mode 0600: `swarmctl start` runs gpud and agentd (two workers), a
#     summarize goes through Redis and PostgreSQL to completed;
#   - neither password in /proc/PID/cmdline or /proc/PID/environ of any
#     process of gpud's and agentd's trees, nor in any log or state file,
#     nor in swarmctl's output;
#   - from the environment instead (SWARM_REDIS_PASSWORD,
#     SWARM_PG_PASSWORD): the same swarm runs; the passwords are then in
#     the processes' environ (readable by their user and root only, as
#     PGPASSWORD would be) and still in no cmdline or log.
#
# Exit: 0 pass, 1 fail, 77 skip (servers missing on a developer machine;
# under CI=true a missing server fails).
set -uo pipefail

swarmctl=$(realpath "${1:?usage: swarmctl_secrets_test.sh SWARMCTL}")
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"
root=$(pwd)
bindir=$(dirname "$swarmctl")/..
gpud=$bindir/gpud/gpud
agentd=$bindir/agentd/agentd
[ -x "$gpud" ] && [ -x "$agentd" ] || { echo "FAIL: gpud or agentd not built next to $swarmctl"; exit 1; }
command -v redis-cli >/dev/null && command -v psql >/dev/null || skip_or_fail "redis-cli or psql missing"
[ -d docs/samples ] || { echo "FAIL: run from the project root"; exit 1; }

top=$(mktemp -d /tmp/swarmsec-it.XXXXXX)
chmod 755 "$top"
srv=$top/srv
mkdir "$srv"
out=$top/out
cfg=$top/swarm.json
state=$top/state

cleanup() {
	SWARM_REDIS_PASSWORD=x SWARM_PG_PASSWORD=x "$swarmctl" --config "$cfg" stop >/dev/null 2>&1
	for f in "$state"/run/*.pid; do
		[ -f "$f" ] && read -r pid _ <"$f" && kill -KILL "$pid" 2>/dev/null
	done
	"$root/scripts/lib/test-servers.sh" stop "$srv" >/dev/null 2>&1
	rm -rf "$top"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

unset SWARM_REDIS_PASSWORD SWARM_PG_PASSWORD SWARM_REDIS_PASSWORD_FILE SWARM_PG_PASSWORD_FILE \
	SWARM_CONFIG SWARM_STATE_DIR SWARM_MODEL SWARM_REDIS_URL SWARM_PG_URL

private_servers "$srv" "$top/srv.err"

# Passwords no log could hold by chance.
rpw="rpw-$RANDOM$RANDOM-$(date +%N)"
ppw="ppw-$RANDOM$RANDOM-$(date +%N)"

redis-cli -p "$rport" CONFIG SET requirepass "$rpw" >/dev/null
admin() { psql -X -q -v ON_ERROR_STOP=1 "$SWARM_TEST_PG_URL" "$@"; }
admin -c "CREATE ROLE swarm_it LOGIN PASSWORD '$ppw'" -c "CREATE DATABASE swarm_it OWNER swarm_it" ||
	{ echo "FAIL: cannot create the role"; exit 1; }
psql -X -q "postgresql://postgres@127.0.0.1:$pgport/swarm_it" -c "CREATE EXTENSION IF NOT EXISTS vector" ||
	{ echo "FAIL: no pgvector"; exit 1; }
hba=$srv/pg/data/pg_hba.conf
{ printf 'host all swarm_it 127.0.0.1/32 scram-sha-256\nlocal all swarm_it scram-sha-256\n'; cat "$hba"; } >"$hba.new"
cat "$hba.new" >"$hba" # keeps the file's owner
admin -c "SELECT pg_reload_conf()" >/dev/null

ok "Redis refuses a client without the password" \
	sh -c "redis-cli -p $rport ping 2>&1 | grep -q NOAUTH"
ok "PostgreSQL refuses swarm_it without the password" \
	sh -c "! PGPASSWORD= psql -X -w 'postgresql://swarm_it@127.0.0.1:$pgport/swarm_it' -c 'SELECT 1' >/dev/null 2>&1"

"$gpud" mkmodel --out "$top/m.gguf" --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 \
	--vocab byte --type q8_0 --seed 7 --context 2048 --name secrets-it >"$top/mk.log" 2>&1 ||
	{ cat "$top/mk.log"; echo "FAIL: mkmodel"; exit 1; }

printf '%s\n' "$rpw" >"$top/redis.pw"
printf '%s' "$ppw" >"$top/pg.pw"
chmod 600 "$top/redis.pw" "$top/pg.pw"

# write_cfg REDIS_URL PG_URL [EXTRA_KEYS]: the external-mode config.
write_cfg() {
	cat >"$cfg" <<-EOF
	{ "state_dir": "$state",
	  "log": { "level": "debug" },
	  "redis": { "url": "$1", "password_file": "$top/redis.pw" },
	  "postgres": { "url": "$2", "password_file": "$top/pg.pw" },
	  "gpud": { "socket": "$top/g.sock", "model": "$top/m.gguf", "threads": 1,
	            "prefix_cache_bytes": 0, "kv_blocks": 256, "max_seqs": 8 },
	  "agentd": { "workers": 2 } ${3:-} }
	EOF
	chmod 644 "$cfg"
}
rurl=redis://127.0.0.1:$rport/0
purl=postgresql://swarm_it@127.0.0.1:$pgport/swarm_it
write_cfg "$rurl" "$purl"
ctl() { "$swarmctl" --config "$cfg" "$@"; }

# --- what is refused ---------------------------------------------------------
chmod 640 "$top/redis.pw"
check "a group-readable password file: refused by swarmctl" 1 \
	"redis.password_file: $top/redis.pw: mode 0640 lets group or others read the password; chmod 600" \
	-- ctl check
check "... and by agentd" 1 "redis.password_file: .*mode 0640" -- "$agentd" --config "$cfg" -n
check "... and by an agentd worker" 1 "redis.password_file: .*mode 0640" \
	-- "$agentd" worker --config "$cfg" -n
chmod 604 "$top/redis.pw"
check "a world-readable password file: refused" 1 "mode 0604 lets group or others" -- ctl check
chmod 600 "$top/redis.pw"
mv "$top/pg.pw" "$top/pg.pw.away"
check "a missing password file: refused, named" 1 \
	"postgres.password_file: $top/pg.pw: No such file or directory" -- ctl check
: >"$top/pg.pw"
chmod 600 "$top/pg.pw"
check "an empty password file: refused" 1 "postgres.password_file: $top/pg.pw: empty" -- ctl check
mv "$top/pg.pw.away" "$top/pg.pw"

write_cfg "redis://:$rpw@127.0.0.1:$rport/0" "$purl"
check "a password in redis.url of a world-readable config: refused" 1 \
	"redis.url holds a password, but the file's mode 0644 lets group or others read it" \
	"redis.password_file" -- ctl check
ok "... the refusal does not echo the password" sh -c "! grep -qF -- '$rpw' '$out'"
write_cfg "$rurl" "postgresql://swarm_it:$ppw@127.0.0.1:$pgport/swarm_it"
check "a password in postgres.url of a world-readable config: refused" 1 \
	"postgres.url holds a password" -- ctl check
chmod 600 "$cfg"
check "... the same in a 0600 config: accepted" 0 "" -- ctl check
ok "... and never echoed" sh -c "! grep -qF -- '$ppw' '$out'"

write_cfg "$rurl" "$purl"
printf 'wrong-%s\n' "$rpw" >"$top/redis.pw"
check "a wrong Redis password: start refused by Redis, no password in the error" 1 \
	"checking redis" "WRONGPASS|invalid password|invalid username-password" \
	-- ctl start
ok "... the message holds neither password" sh -c "! grep -qF -- '$rpw' '$out'"
printf '%s\n' "$rpw" >"$top/redis.pw"

# --- the swarm on password files ---------------------------------------------
check "check with both password files (mode 0600)" 0 "" -- ctl check
check "start gpud and agentd" 0 "checking redis \.\.\. ok" "checking postgres \.\.\. ok" \
	"starting gpud \.\.\. ok" "starting agentd \.\.\. ok" -- ctl start
check "a summarize goes through Redis and PostgreSQL" 0 "completed" \
	-- ctl submit docs/samples/sourdough.txt --wait --max-tokens 4 --timeout 300

# tree PID...: the pids and all their descendants.
tree() {
	local want=" $* "
	for f in /proc/[0-9]*/stat; do
		s=$(cat "$f" 2>/dev/null) || continue
		rest=${s##*) }
		set -- $rest
		echo "${f//[^0-9]/} $2"
	done | awk -v roots="$want" '
		{ parent[$1] = $2 }
		END {
			n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1
			changed = 1
			while (changed) {
				changed = 0
				for (p in parent)
					if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 }
			}
			for (p in keep) if (p in parent) print p
		}'
}

# scan WHAT...: counts the processes of gpud's and agentd's trees whose
# /proc/PID/WHAT holds either password; lists them on stdout.
scan() {
	local what=$1 gp ap p
	read -r gp _ <"$state/run/gpud.pid"
	read -r ap _ <"$state/run/agentd.pid"
	tree "$gp" "$ap" >"$top/pids"
	while read -r p; do
		if tr '\0' '\n' <"/proc/$p/$what" 2>/dev/null | grep -qF -e "$rpw" -e "$ppw"; then
			echo "$p $(tr '\0' ' ' <"/proc/$p/cmdline")"
		fi
	done <"$top/pids"
}

scan cmdline >"$top/hits"
ok "the trees hold gpud, agentd and its 2 workers (>= 4 processes)" \
	test "$(wc -l <"$top/pids")" -ge 4
ok "no password in any process's cmdline" test ! -s "$top/hits"
scan environ >"$top/hits"
ok "password files: no password in any process's environ" test ! -s "$top/hits"
cat "$top/hits"
ok "no password in any log or state file" \
	sh -c "! grep -rqaF -e '$rpw' -e '$ppw' '$state'"
check "status: up, and no password in its output" 0 "" -- ctl status
ok "... none printed" sh -c "! grep -qF -e '$rpw' -e '$ppw' '$out'"
check "stop" 0 "" -- ctl stop

# --- the same from the environment ------------------------------------------
write_cfg "$rurl" "$purl"
sed -i 's/, "password_file": "[^"]*"//' "$cfg"
check "without any password: Redis refuses" 1 "NOAUTH|Authentication required" -- ctl start
export SWARM_REDIS_PASSWORD=$rpw SWARM_PG_PASSWORD=$ppw
check "passwords from the environment: start" 0 "" -- ctl start
check "... a summarize completes" 0 "completed" \
	-- ctl submit docs/samples/sourdough.txt --wait --max-tokens 4 --timeout 300
scan cmdline >"$top/hits"
ok "... no password in any process's cmdline" test ! -s "$top/hits"
scan environ >"$top/hits"
ok "... they are in the environ of the processes (as exported; root and their user read it)" \
	test -s "$top/hits"
ok "... no password in any log or state file" \
	sh -c "! grep -rqaF -e '$rpw' -e '$ppw' '$state'"
check "stop" 0 "" -- ctl stop
unset SWARM_REDIS_PASSWORD SWARM_PG_PASSWORD

# --- a Redis 6 ACL user in redis.url, its password percent-encoded ---------------
# (AUTH user password; the password holds '/', '@', '%' and ':', which a URL
# must encode)
apw="a/p@s%w:$RANDOM$RANDOM"
enc=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$apw")
redis-cli -p "$rport" -a "$rpw" --no-auth-warning ACL SETUSER swarm_acl on ">$apw" '~*' '&*' '+@all' \
	>/dev/null
write_cfg "redis://swarm_acl:$enc@127.0.0.1:$rport/0" "$purl"
sed -i 's/"redis": { "url": \("[^"]*"\), "password_file": "[^"]*"/"redis": { "url": \1/' "$cfg"
chmod 600 "$cfg"
check "an ACL user and its encoded password in redis.url: start" 0 "checking redis \.\.\. ok" \
	-- ctl start
check "... a summarize completes" 0 "completed" \
	-- ctl submit docs/samples/sourdough.txt --wait --max-tokens 4 --timeout 300
ok "... agentd's connections are the ACL user's" sh -c \
	"redis-cli -p $rport -a '$rpw' --no-auth-warning CLIENT LIST | grep -q 'name=agentd:.* user=swarm_acl '"
ok "... its password in no log or state file" sh -c "! grep -rqaF -e '$apw' -e '$enc' '$state'"
check "stop" 0 "" -- ctl stop

echo "1..$n"
[ "$failures" = 0 ] || { echo "FAIL: $failures of $n"; exit 1; }
echo "PASS: $n checks"
