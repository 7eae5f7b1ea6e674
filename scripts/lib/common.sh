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
