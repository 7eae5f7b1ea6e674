# scripts/lib/common.sh - helpers shared by scripts/setup, test and demo.
# shellcheck shell=bash
# Sourced, never run. Callers have already done `set -euo pipefail`.

SW_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

sw_log() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
sw_die() { sw_log "error: $*"; exit 1; }

# Runs a command as root: directly when we are root, else through sudo.
sw_as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1; then
		sudo "$@"
	else
		sw_die "need root (or sudo) to run: $*"
	fi
}

# Configures build directory $1 (relative to the current directory;
# callers cd to $SW_ROOT first) once, or updates its options; meson
# options may follow. --werror when CI=true.
sw_configure() {
	local dir=$1
	shift
	local werror=false
	[ "${CI:-}" = true ] && werror=true
	if [ -f "$dir/build.ninja" ]; then
		meson configure "$dir" -Dwerror=$werror "$@" >/dev/null
	else
		meson setup "$dir" -Dwerror=$werror "$@"
	fi
}

# Configures (as sw_configure) and builds everything in $1.
sw_build() {
	sw_configure "$@" && nice ninja -C "$1"
}

# sw_build_suite DIR SUITES [meson options...]: configures DIR (as
# sw_configure) and builds only what the tests of SUITES (one, or several
# comma-separated) run: their executables and the targets they declare in
# `depends` (meson's introspection files, meson-info/). Run those tests
# with --no-rebuild: meson test would otherwise build everything first.
sw_build_suite() {
	local dir=$1 suite=$2 outs
	shift 2
	sw_configure "$dir" "$@" || return
	# a build dir from before a meson.build change: regenerate first, so
	# that the introspection files below list today's tests
	ninja -C "$dir" build.ninja >/dev/null || return
	outs=$(python3 - "$dir" "$suite" <<'PY'
import json, os, sys
d, suites = os.path.abspath(sys.argv[1]), sys.argv[2].split(',')
info = os.path.join(d, 'meson-info')
tests = json.load(open(os.path.join(info, 'intro-tests.json')))
targets = {t['id']: t for t in json.load(open(os.path.join(info, 'intro-targets.json')))}
built = {f for t in targets.values() for f in t['filename']}
outs = set()
for t in tests:
    if not any(s == x or s.endswith(':' + x) for s in t['suite'] for x in suites):
        continue
    for i in t['depends']:
        outs.update(targets[i]['filename'] if i in targets else [])
    if t['cmd'] and t['cmd'][0] in built:
        outs.add(t['cmd'][0])
if not outs:
    sys.exit('sw_build_suite: no test of suite %s in %s' % (sys.argv[2], d))
print('\n'.join(sorted(os.path.relpath(f, d) for f in outs)))
PY
) || return
	# shellcheck disable=SC2086 # one target per line, no spaces in them
	nice ninja -C "$dir" $outs
}
