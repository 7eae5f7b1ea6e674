# scripts/lib/port.sh - a free TCP port on 127.0.0.1 for a test server.
# shellcheck shell=bash
# Sourced, never run.
#
# pick_port prints a port that no socket of this machine uses right now,
# in any state, drawn from below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default). Ports
# inside that range are what connect() hands to outgoing connections: a
# port that is free when picked can be some client's local port a moment
# later, and bind() then fails with "Address already in use" (a CI run
# of 2026-12-06 lost gpud's metrics port 40054 that way). Below the range
# only another server that picks the same port can race us (where the
# range leaves no room below or above it, the draw is from the range).
# Returns 1 after 50 draws that were all in use.
pick_port() {
	local lo=32768 hi=60999 base=10000 span p
	if [ -r /proc/sys/net/ipv4/ip_local_port_range ]; then
		read -r lo hi </proc/sys/net/ipv4/ip_local_port_range || true
	fi
	if [ "$lo" -gt $((base + 1000)) ]; then
		span=$((lo - base))
	elif [ "$hi" -lt 64535 ]; then # the range starts low: the ports above it
		base=$((hi + 1)) span=$((65535 - hi))
	else # it covers nearly every port: draw from it, and the race stays
		span=$((65536 - base))
	fi
	for _ in $(seq 1 50); do
		p=$((base + (RANDOM * 32768 + RANDOM) % span))
		if command -v ss >/dev/null 2>&1; then
			# any state: a listener, a connection, a TIME_WAIT
			[ -z "$(ss -tanH "( sport = :$p )" 2>/dev/null)" ] || continue
		elif (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			continue
		fi
		echo "$p"
		return 0
	done
	return 1
}
