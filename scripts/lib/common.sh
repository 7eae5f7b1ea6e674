# scripts/lib/common.sh - helpers shared by scripts/setup, test and demo.
# Sourced, never run. Callers have already done `set -euo pipefail`.

SW_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SW_PG_BIN=/usr/lib/postgresql/15/bin

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

# Configures (once) and builds the default build directory, $1 (default
# build/). Extra meson options may follow. --werror when CI=true.
sw_build() {
	local dir=${1:-build}
	shift || true
	local werror=false
	[ "${CI:-}" = true ] && werror=true
	if [ -f "$SW_ROOT/$dir/build.ninja" ]; then
		meson configure "$SW_ROOT/$dir" -Dwerror=$werror "$@" >/dev/null
	else
		meson setup "$SW_ROOT/$dir" "$SW_ROOT" -Dwerror=$werror "$@"
	fi
	ninja -C "$SW_ROOT/$dir"
}
