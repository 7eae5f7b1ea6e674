#!/usr/bin/env bash
# bench/chunk_answer.sh - chunk KV reused at any position (issue 14),
# measured as the issue asks: answer-style prompts (a system prompt of 64
# tokens, k = 4 chunks of 256 tokens drawn from a pool of 40, a question of
# 32 tokens; the chunks and the system prompt see only themselves, the
# question everything) at 16 concurrent requests, through `gpud serve` with
# the chunk-KV cache off and on (the prefix cache on in both). Prints, per
# run, the prompt tokens, those served from a cache and those computed,
# TTFT p50/p99, wall and gpud CPU time, and the prefix and chunk caches'
# counters after the run.
#
#   bench/chunk_answer.sh GPUD GPUD_LOAD [REQUESTS [RUNS]]
#
# The model is made here with `gpud mkmodel` (random F32 weights, byte
# vocabulary; stories260K's 512-token context is too short for 1,120-token
# prompts): dim 128, 4 layers, 4 heads, 2 KV heads, ffn 384, context 2048.
# One device, THREADS threads (default 2); everything under nice. The same
# --seed in both configurations: the same prompts in the same order. Each
# configuration starts a fresh gpud (empty caches). Needs jq.
set -euo pipefail

usage="usage: GPUD GPUD_LOAD [REQUESTS [RUNS]]"
gpud=$(realpath "${1:?$usage}")
load=$(realpath "${2:?$usage}")
requests=${3:-64}
runs=${4:-1}
threads=${THREADS:-2}
command -v jq >/dev/null || { echo "jq is not installed" >&2; exit 1; }

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_scratch chunk

nice "$gpud" mkmodel --out "$tmp/m.gguf" --dim 128 --layers 4 --heads 4 --kv-heads 2 \
	--ffn 384 --context 2048 --type f32 --seed 5 >/dev/null

run() { # $1: chunk_cache_bytes, $2: label, $3: run index
	rm -rf "$tmp/state" "$tmp/gpud.sock"
	cat >"$tmp/gpud.json" <<JSON
{
  "state_dir": "$tmp/state",
  "log": { "level": "info", "file": "$tmp/gpud.log" },
  "gpud": {
    "socket": "$tmp/gpud.sock",
    "model": "$tmp/m.gguf",
    "devices": ["cpu"],
    "threads": $threads,
    "kv_blocks": 4096,
    "max_seqs": 16,
    "prefix_cache_bytes": "64MiB",
    "chunk_cache_bytes": $1,
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
	nice "$load" --socket "$tmp/gpud.sock" --requests "$requests" --concurrency 16 \
		--answer 64:4:256:40:32 --max-tokens 8 --seed 14 --json >"$tmp/r.json"
	jq -r --arg lab "$2" --arg run "$3" '
		"\($lab) run \($run): prompt \(.prompt_tokens), from caches \(.cached_prompt_tokens), computed \(.prompt_tokens - .cached_prompt_tokens) (\(
		  if .prompt_tokens > 0 then (1000 * (.prompt_tokens - .cached_prompt_tokens) / .prompt_tokens
		  | floor) / 10 else 0 end)%), TTFT p50 \(.ttft_ms.p50 | floor) ms, p99 \(.ttft_ms.p99 | floor) ms, wall \(.wall_s * 1000 | floor) ms, gpud CPU \(.gpud_cpu_s * 1000 | floor) ms, errors \(.errors), allocations since warm-up \(.alloc.since_warmup.host // "?")",
		(.caches[] | select(.name | test("[.](prefix|chunk)$")) |
		 "  \(.name): hits \(.hits), misses \(.misses), tokens \(.hit_tokens), entries \(.entries), bytes \(.bytes)/\(.max_bytes), evictions \(.evictions)")' "$tmp/r.json"
	bench_stop
}

echo "answer-style prompts: system 64, k=4 chunks of 256 from a pool of 40, question 32;" \
     "$requests requests, 16 concurrent, 8 tokens generated, seed 14, $threads threads"
for r in $(seq 1 "$runs"); do
	run 0 "chunk cache off" "$r"
	run '"64MiB"' "chunk cache on " "$r"
done
