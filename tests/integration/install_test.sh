#!/usr/bin/env bash
# install_test.sh - `meson install` into a DESTDIR, then the installed
# programs run from there.
#
#   install_test.sh BUILD_DIR BINDIR SQLDIR CONFDIR UNITDIR LOGROTATEDIR
#
# The directories are the absolute install paths meson computed; the
# test's DESTDIR goes on top of them. Cases: every file lands where the
# programs and the systemd units look for it; a reinstall keeps an
# edited configuration; gpud --version; a model made by the installed
# `gpud mkmodel`; `gpud serve --check` on the installed configuration
# pointed at that model; `agentd --version` names the installed SQL
# directory; `agentd -n`, `swarmctl --help` and `swarmctl check` on the
# installed configuration. Then, against a private Redis and PostgreSQL
# (SWARM_TEST_REDIS_URL and SWARM_TEST_PG_URL from scripts/test, else
# started here by scripts/lib/test-servers.sh), the installed swarmctl
# starts the installed gpud and agentd (found beside it), agentd applies
# the installed migrations to a fresh database, status says both are up,
# and stop stops them.
#
# The installed agentd looks for its migrations in SQLDIR, outside the
# DESTDIR: the server cases point it at DESTDIR's copy with SWARM_SQL_DIR
# (agentd/sql_dir.h), after checking that SQLDIR is where the copy is.
#
# Exit: 0 pass, 1 fail, 77 skip (no Redis or PostgreSQL on a developer
# machine, once the cases that need none passed; under CI=true a missing
# server is a failure). Everything the test started is stopped on exit.
set -uo pipefail

build=$(realpath "${1:?usage: install_test.sh BUILD_DIR BINDIR SQLDIR CONFDIR UNITDIR LOGROTATEDIR}")
bindir=${2:?} sqldir=${3:?} confdir=${4:?} unitdir=${5:?} logrotatedir=${6:?}
. "$(dirname "${BASH_SOURCE[0]}")/check.sh"

top=$(mktemp -d /tmp/swarm-install.XXXXXX)
chmod 755 "$top"
D=$top/root
out=$top/out
state=$top/s
srv=
db=
dburl=
redis_url=

# Stops what the server cases started: the services by their pid files,
# the private servers, the database; then removes the directory.
cleanup() {
	local f pid
	for f in "$state"/run/*.pid; do
		[ -f "$f" ] || continue
		read -r pid _ <"$f" || continue
		kill -KILL "$pid" 2>/dev/null
	done
	if [ -n "$db" ]; then
		psql -q "$SWARM_TEST_PG_URL" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
			>/dev/null 2>&1
	fi
	if [ -n "$redis_url" ] && command -v redis-cli >/dev/null; then
		redis-cli -u "$redis_url" DEL swarm:tasks swarm:results swarm:dead >/dev/null 2>&1
	fi
	[ -n "$srv" ] && scripts/lib/test-servers.sh stop "$srv" >/dev/null 2>&1
	rm -rf "$top"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

done_or_skip() {
	if [ "$failures" -gt 0 ]; then
		echo "$failures of $n failed"
		exit 1
	fi
	skip_or_fail "$* ($n cases passed before)"
}

unset SWARM_CONFIG SWARM_MODEL SWARM_SQL_DIR SWARM_GPUD_BIN SWARM_AGENTD_BIN

# --- the files ------------------------------------------------------------------
check "meson install --destdir" 0 "Installing" \
	-- meson install -C "$build" --no-rebuild --destdir "$D"
for p in gpud agentd swarmctl gpud-load; do
	ok "$bindir/$p installed" test -x "$D$bindir/$p"
done
ok "migrations in $sqldir" test -f "$D$sqldir/001_init.sql"
ok "the shipped configuration in $confdir" cmp -s config/swarm.json "$D$confdir/swarm.json"
ok "the logrotate snippet in $logrotatedir" cmp -s config/logrotate/swarm "$D$logrotatedir/swarm"
for u in gpud agentd gpud-http; do
	args="--config $confdir/swarm.json"
	[ $u = gpud ] && args="serve $args"
	check "$u.service runs the installed $u on the installed configuration" 0 \
		"^ExecStart=$bindir/$u $args\$" "^Documentation=file:///" \
		-- cat "$D$unitdir/$u.service"
	ok "$u.service: every @placeholder@ replaced" \
		bash -c "! grep -q '@[a-z]*@' '$D$unitdir/$u.service'"
done
if command -v readelf >/dev/null; then
	ok "no run path into the build tree" \
		bash -c "! readelf -d '$D$bindir/gpud' '$D$bindir/agentd' '$D$bindir/swarmctl' |
			grep -F '$build'"
fi
# an edited configuration survives a reinstall
printf '{ "state_dir": "/var/lib/swarm" }\n' >"$D$confdir/swarm.json"
check "reinstall" 0 "Installing" \
	-- meson install -C "$build" --no-rebuild --destdir "$D"
ok "reinstall keeps an edited configuration" grep -q '^{ "state_dir"' "$D$confdir/swarm.json"
cp config/swarm.json "$D$confdir/swarm.json"

# --- the programs, no server ----------------------------------------------------
gpud=$D$bindir/gpud agentd=$D$bindir/agentd swarmctl=$D$bindir/swarmctl
model=$top/model.gguf
check "gpud --version" 0 "^gpud [0-9]+\.[0-9]+" -- "$gpud" --version
check "gpud mkmodel" 0 -- "$gpud" mkmodel --out "$model" --dim 64 --layers 2 --heads 2 \
	--kv-heads 1 --ffn 128 --vocab byte --context 512 --name install-test
# the installed configuration as shipped, with the model and a cpu device
conf_env=(SWARM_MODEL="$model" SWARM_DEVICES=cpu SWARM_THREADS=1
	SWARM_GPUD_SOCKET="$top/gpud.sock" SWARM_STATE_DIR="$state")
check "gpud serve --check on the installed configuration" 0 \
	"configuration OK" "memory plan" \
	-- env "${conf_env[@]}" "$gpud" serve --config "$D$confdir/swarm.json" --check
check "agentd --version names the installed migrations" 0 \
	"^agentd [0-9]+\.[0-9]+" "^migrations: $sqldir\$" -- "$agentd" --version
check "agentd -n on the installed configuration" 0 "configuration OK" \
	-- env "${conf_env[@]}" "$agentd" --config "$D$confdir/swarm.json" -n
check "swarmctl --help" 0 "usage: swarmctl" -- "$swarmctl" --help
check "swarmctl check on the installed configuration" 0 "configuration OK" \
	-- env "${conf_env[@]}" "$swarmctl" --config "$D$confdir/swarm.json" check

# --- the programs against Redis and PostgreSQL -------------------------------------
if [ -z "${SWARM_TEST_REDIS_URL:-}" ] || [ -z "${SWARM_TEST_PG_URL:-}" ]; then
	srv=$top/srv
	mkdir "$srv"
	if ! env_lines=$(scripts/lib/test-servers.sh start -o $$ "$srv" 2>"$top/srv.err"); then
		sed 's/^/#   | /' "$top/srv.err"
		srv=
		done_or_skip "no private Redis and PostgreSQL"
	fi
	while IFS= read -r line; do
		export "${line?}"
	done <<<"$env_lines"
fi
command -v psql >/dev/null || done_or_skip "psql not installed"
db=swarm_install_$$
check "a fresh database" 0 -- psql -q "$SWARM_TEST_PG_URL" -c "CREATE DATABASE $db"
dburl=${SWARM_TEST_PG_URL%/*}/$db
# Redis database 9 where the URL allows (the other tests' swarm:* streams
# stay apart); agentd's streams are deleted at exit
redis_url=$SWARM_TEST_REDIS_URL
[[ $redis_url =~ ^(redis://[^/]+)(/[0-9]+)?$ ]] && redis_url=${BASH_REMATCH[1]}/9
cat >"$top/swarm.json" <<EOF
{ "state_dir": "$state",
  "redis": { "url": "$redis_url" },
  "postgres": { "url": "$dburl" },
  "gpud": { "socket": "$state/gpud.sock", "model": "$model", "devices": ["cpu"],
            "threads": 1, "max_connections": 8 },
  "agentd": { "workers": 1 } }
EOF
ctl() { SWARM_SQL_DIR="$D$sqldir" "$swarmctl" --config "$top/swarm.json" "$@"; }
if check "swarmctl start: the installed gpud and agentd" 0 \
	"checking redis \.\.\. ok" "checking postgres \.\.\. ok" \
	"starting gpud \.\.\. ok" "starting agentd \.\.\. ok" -- ctl start; then
	for s in gpud agentd; do
		read -r pid _ <"$state/run/$s.pid"
		ok "$s runs from the DESTDIR" test "$(readlink "/proc/$pid/exe")" = "$D$bindir/$s"
	done
	applied=
	want="001_init.sql 002_task_document.sql"
	for _ in $(seq 1 300); do
		applied=$(psql -tA "$dburl" -c "SELECT string_agg(name, ' ' ORDER BY version) FROM schema_migrations" 2>/dev/null)
		[ "$applied" = "$want" ] && break
		sleep 0.1
	done
	ok "agentd applied the installed migrations" test "$applied" = "$want"
	check "swarmctl status" 0 "gpud +up" "agentd +up" -- ctl status
	check "swarmctl stop" 0 "stopping agentd" "stopping gpud" -- ctl stop
fi

if [ "$failures" -gt 0 ]; then
	echo "$failures of $n failed"
	exit 1
fi
echo "all $n passed"
exit 0
