#!/usr/bin/env bash
# openai_client_test.sh - gpud-http against a real third-party client: the
# official `openai` npm package, driven by openai_client_test.mjs (chat,
# streaming chat, a completion, embeddings, errors), on a private gpud.
#
#   openai_client_test.sh GPUD GPUD_HTTP
#
# Starts `gpud serve` on a copy of ../shared/models/stories260K.gguf given
# a Llama 2 chat template (gguf_chat_template.py: the model has none, and
# gpud refuses chat on a model without one) on one cpu device, in a
# temporary directory, then gpud-http on a free 127.0.0.1 port with a
# key file (mode 0600), waits for GET /health to answer 200, runs the Node
# script with that key, and stops gpud-http (SIGTERM: it must exit 0) and
# gpud.
#
# Exit: 0 pass, 1 fail, 77 skip: gpud-http not built (GPUD_HTTP missing),
# the model missing, or - on a developer machine - no node or no openai
# package in tests/integration/node_modules (scripts/setup installs both;
# under CI=true those two fail).
set -uo pipefail

gpud=${1:?usage: openai_client_test.sh GPUD GPUD_HTTP}
http=${2:?usage: openai_client_test.sh GPUD GPUD_HTTP}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/check.sh"
model=../shared/models/stories260K.gguf

[ -x "$http" ] || { echo "SKIP: gpud-http not built ($http)"; exit 77; }
[ -f "$model" ] || { echo "SKIP: $model missing"; exit 77; }
command -v node >/dev/null || skip_or_fail "node not installed (scripts/setup)"
[ -f "$here/node_modules/openai/package.json" ] ||
	skip_or_fail "the openai npm package is not in $here/node_modules (scripts/setup)"
command -v curl >/dev/null || skip_or_fail "curl not installed"

top=$(mktemp -d /tmp/openai-it.XXXXXX)
gpid= hpid=
cleanup() {
	[ -n "$hpid" ] && kill -KILL "$hpid" 2>/dev/null
	[ -n "$gpid" ] && kill -KILL "$gpid" 2>/dev/null
	rm -rf "$top"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

port=$(pick_port) || { echo "FAIL: no free port"; exit 1; }
python3 "$here/gguf_chat_template.py" "$model" "$top/model.gguf" \
	'{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}' ||
	{ echo "FAIL: gguf_chat_template.py"; exit 1; }
key=sk-swarm-it-$RANDOM$RANDOM
printf '%s\n' "$key" >"$top/keys"
chmod 600 "$top/keys"
cat >"$top/swarm.json" <<EOF
{ "state_dir": "$top/state",
  "log": { "level": "info" },
  "gpud": { "socket": "$top/gpud.sock", "model": "$top/model.gguf",
            "devices": ["cpu"], "threads": 1 },
  "http": { "listen": "127.0.0.1:$port", "api_key_file": "$top/keys" } }
EOF
mkdir -p "$top/state"

# dump NAME FILE: the end of a log, after a failure
dump() { echo "# last lines of $1:"; tail -n 30 "$2" | sed 's/^/#   | /'; }

"$gpud" serve --config "$top/swarm.json" >"$top/gpud.log" 2>&1 &
gpid=$!
"$http" --config "$top/swarm.json" >"$top/http.log" 2>&1 &
hpid=$!
up=0
for _ in $(seq 1 600); do
	code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health")
	[ "$code" = 200 ] && { up=1; break; }
	kill -0 "$hpid" 2>/dev/null || break
	sleep 0.1
done
if [ $up != 1 ]; then
	echo "not ok 1 - gpud-http answered GET /health with 200 (last: $code)"
	dump gpud "$top/gpud.log"
	dump gpud-http "$top/http.log"
	exit 1
fi
n=1
echo "ok 1 - gpud-http answered GET /health with 200"

# the Node script's own checks (its TAP lines, indented)
out=$top/node.out
echo "# node $(node --version), openai $(node -p 'require(process.argv[1]).version' \
	"$here/node_modules/openai/package.json")"
SWARM_OPENAI_BASE_URL=http://127.0.0.1:$port/v1 SWARM_OPENAI_KEY=$key \
	timeout 300 node "$here/openai_client_test.mjs" >"$out" 2>&1
rc=$?
sed 's/^/    /' "$out"
got=$(grep -cE '^ok [0-9]+ - ' "$out")
n=$((n + got))
if [ $rc -ne 0 ]; then
	failures=$((failures + 1))
	dump gpud-http "$top/http.log"
fi

n=$((n + 1))
kill -TERM "$hpid"
wait "$hpid"
hrc=$?
hpid=
if [ $hrc = 0 ]; then
	echo "ok $n - gpud-http exits 0 on SIGTERM"
else
	echo "not ok $n - gpud-http exits 0 on SIGTERM (exit $hrc)"
	failures=$((failures + 1))
fi
kill -TERM "$gpid"
wait "$gpid"
gpid=

echo "1..$n"
if [ $failures -ne 0 ]; then
	echo "# $failures failed"
	exit 1
fi
exit 0
