#!/usr/bin/env bash
# bench/placement_repeat.sh - prefix-aware placement, measured as the
# issue did: `gpud serve` (stories260K) on N cpu devices, then the same
# prompts sent twice with gpud-load (same --seed: the same prompts and
# descriptors in the same order). Prints, per pass, prompt and cached
# tokens, and per device the engine tokens and the placement decisions.
#
#   bench/placement_repeat.sh GPUD GPUD_LOAD N_DEV [REQUESTS [CONCURRENCY]]
#
# The figures the issue asks for: pass 2's cached / prompt tokens (the
# share of repeated prompt tokens served from the cache) and pass 1's
# per-device tokens (distinct prompts: how even load placement is).
# MARGIN=N sets gpud.placement_margin (a build without the key refuses
# it). One thread per device; everything under nice. Needs jq.
set -euo pipefail

gpud=$(realpath "${1:?usage: GPUD GPUD_LOAD N_DEV [REQUESTS [CONCURRENCY]]}")
load=$(realpath "${2:?usage: GPUD GPUD_LOAD N_DEV [REQUESTS [CONCURRENCY]]}")
ndev=${3:?usage: GPUD GPUD_LOAD N_DEV [REQUESTS [CONCURRENCY]]}
requests=${4:-60}
conc=${5:-8}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=$root/../shared/models/stories260K.gguf
command -v jq >/dev/null || { echo "jq is not installed" >&2; exit 1; }

# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
bench_scratch placement

margin=
[ -n "${MARGIN:-}" ] && margin=" \"placement_margin\": $MARGIN,"
devs=$(printf '"cpu",%.0s' $(seq 1 "$ndev"))
cat >"$tmp/gpud.json" <<JSON
{
  "state_dir": "$tmp/state",
  "log": { "level": "info", "file": "$tmp/gpud.log" },
  "gpud": {
    "socket": "$tmp/gpud.sock",
    "model": "$(realpath "$model")",
    "devices": [${devs%,}],
    "threads": 1,
    "kv_blocks": 1024,
    "prefix_cache_bytes": "64MiB",$margin
    "shutdown_deadline_ms": 5000
  }
}
JSON
nice "$gpud" serve --config "$tmp/gpud.json" >"$tmp/gpud.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
	[ -S "$tmp/gpud.sock" ] && break
	kill -0 "$pid" 2>/dev/null || { cat "$tmp/gpud.out"; exit 1; }
	sleep 0.1
done
[ -S "$tmp/gpud.sock" ] || { echo "gpud did not listen" >&2; exit 1; }

echo "$ndev cpu devices, $requests prompts of 150-250 tokens sent twice, concurrency $conc, seed 11"
for pass in 1 2; do
	nice "$load" --socket "$tmp/gpud.sock" --requests "$requests" --concurrency "$conc" \
		--prompt-tokens 150:250 --max-tokens 16 --seed 11 --json >"$tmp/p$pass.json"
	jq -r --arg pass "$pass" '
		"pass \($pass): prompt \(.prompt_tokens), cached \(.cached_prompt_tokens) (\(
		  if .prompt_tokens > 0 then (1000 * .cached_prompt_tokens / .prompt_tokens
		  | floor) / 10 else 0 end)%), wall \(.wall_s * 1000 | floor) ms, gpud CPU \(
		  .gpud_cpu_s * 1000 | floor) ms, TTFT p50 \(.ttft_ms.p50 | floor) ms",
		(.devices_delta[] | "  \(.name): tokens \(.tokens), steps \(.steps), placed by prefix \(.placed_prefix), by load \(.placed_load)"),
		"  tokens per device: max/min \(
		  [.devices_delta[].tokens] as $t | if ($t | min) > 0 then
		  (100 * ($t | max) / ($t | min) | floor) / 100 else "inf" end)"' "$tmp/p$pass.json"
done
