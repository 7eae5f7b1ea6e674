#!/usr/bin/env bash
# bench/http_overhead.sh - what the HTTP front costs: the same streaming
# load on gpud's native protocol and through gpud-http, at several
# concurrencies, interleaved.
#
#   bench/http_overhead.sh GPUD GPUD_HTTP GPUD_LOAD OUTDIR [REPEAT [CLIENTS]]
#
# (REPEAT 0: only the report of the runs.tsv already in OUTDIR.)
# Starts `gpud serve` on ../shared/models/stories260K.gguf (a copy with a
# Llama 2 chat template, tests/integration/gguf_chat_template.py; two cpu
# devices of one thread each) and gpud-http on a free loopback port (no key), in a
# temporary directory, then REPEAT times (default 3), for each concurrency
# C of CLIENTS (default "1 16 64"), runs back to back:
#   native      gpud-load --socket S --causal --segments 1
#   http        gpud-load --http URL --endpoint completions (the same
#               prompts, token for token: no chat template)
#   http-chat   gpud-load --http URL (/v1/chat/completions, the prompt as
#               one user message)
# each with the same seed (the same prompts; gpud's prefix cache is off,
# so no run is served from an earlier one's), --requests 6*C (at least 24), --prompt-tokens
# 32:128, --max-tokens 32, greedy, --json (environment: MIN_REQUESTS
# replaces the 24, MAX_TOKENS the 32); the HTTP runs also name the
# socket (gpud's CPU time and its counters) and gpud-http's pid (its CPU
# time). A run that gpud-http does not survive is done again on a new
# one (at most twice), the death counted (deaths.txt) and the end of its
# log kept (gpud-http-death-N.log). Everything runs under nice. OUTDIR gets runs.tsv (one line per
# run), summary.tsv (medians per mode and C), and, when gnuplot is there,
# throughput.png and ttft.png (plot.gp). The summary is printed.
# Exit: 0 when every run succeeded.
set -euo pipefail

gpud=$(realpath "${1:?usage: http_overhead.sh GPUD GPUD_HTTP GPUD_LOAD OUTDIR [REPEAT [CLIENTS]]}")
http=$(realpath "${2:?}")
load=$(realpath "${3:?}")
outdir=${4:?}
repeat=${5:-3}
clients=${6:-1 16 64}
mkdir -p "$outdir"
outdir=$(realpath "$outdir")

# report: summary.tsv (the medians of the complete runs in runs.tsv) and,
# with gnuplot, the plots; prints the summary
report() {
python3 - "$outdir/runs.tsv" >"$outdir/summary.tsv" <<-'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l[0] not in "#r"]
# a run with failed requests (gpud-http died under it) is no measurement
rows = [r for r in rows if r[3] == r[4]]
keys = ["tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "lat_p50_ms", "gpud_cpu_s", "front_cpu_s"]
col = {k: i for i, k in enumerate(["run", "mode", "clients", "requests", "ok", "gen_tokens",
    "prompt_tokens", "cached_tokens", "wall_s", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "lat_p50_ms",
    "lat_p99_ms", "gpud_cpu_s", "front_cpu_s", "tool_cpu_s"])}
print("clients\tmode\tcomplete_runs\t" + "\t".join(keys))
for c in sorted({int(r[2]) for r in rows}):
    for m in ["native", "http", "http-chat"]:
        sel = [r for r in rows if int(r[2]) == c and r[1] == m]
        if sel:
            print(f"{c}\t{m}\t{len(sel)}\t" + "\t".join(
                f"{statistics.median(float(r[col[k]]) for r in sel):.3f}" for k in keys))
# paired within a repeat (the runs of one repeat are back to back, so the
# machine's drift cancels): HTTP against native
print("#\n# paired: median over the repeats where both runs are complete")
print("# clients\tmode\tpairs\ttokens_per_s_ratio\tttft_p50_delta_ms\tttft_p99_delta_ms")
for c in sorted({int(r[2]) for r in rows}):
    for m in ["http", "http-chat"]:
        ratio, d50, d99 = [], [], []
        for run in sorted({r[0] for r in rows}):
            a = [r for r in rows if r[0] == run and int(r[2]) == c and r[1] == m]
            b = [r for r in rows if r[0] == run and int(r[2]) == c and r[1] == "native"]
            if a and b:
                a, b = a[0], b[0]
                ratio.append(float(a[col["tokens_per_s"]]) / float(b[col["tokens_per_s"]]))
                d50.append(float(a[col["ttft_p50_ms"]]) - float(b[col["ttft_p50_ms"]]))
                d99.append(float(a[col["ttft_p99_ms"]]) - float(b[col["ttft_p99_ms"]]))
        if ratio:
            print(f"# {c}\t{m}\t{len(ratio)}\t{statistics.median(ratio):.3f}\t"
                  f"{statistics.median(d50):.3f}\t{statistics.median(d99):.3f}")
EOF
cat "$outdir/summary.tsv"
if command -v gnuplot >/dev/null; then
	cat >"$outdir/plot.gp" <<-'EOF'
	# gnuplot plot.gp (in this directory): summary.tsv's medians
	set terminal pngcairo size 900,500 noenhanced
	set datafile separator "\t"
	set key top left
	set grid
	set logscale x 2
	set xlabel "concurrent streams"
	set output "throughput.png"
	set title "generated tokens/s (median of runs): native protocol vs gpud-http"
	set ylabel "tokens/s"
	plot "< grep -P '^[0-9]+\tnative\t' summary.tsv" using 1:4 with linespoints title "native", \
	     "< grep -P '^[0-9]+\thttp\t' summary.tsv" using 1:4 with linespoints title "http /v1/completions", \
	     "< grep -P '^[0-9]+\thttp-chat\t' summary.tsv" using 1:4 with linespoints title "http /v1/chat/completions"
	set output "ttft.png"
	set title "time to first token, p50 and p99 (median of runs)"
	set ylabel "ms"
	set logscale y
	plot "< grep -P '^[0-9]+\tnative\t' summary.tsv" using 1:5 with linespoints title "native p50", \
	     "< grep -P '^[0-9]+\thttp\t' summary.tsv" using 1:5 with linespoints title "http p50", \
	     "< grep -P '^[0-9]+\thttp-chat\t' summary.tsv" using 1:5 with linespoints title "http-chat p50", \
	     "< grep -P '^[0-9]+\tnative\t' summary.tsv" using 1:6 with linespoints dashtype 2 title "native p99", \
	     "< grep -P '^[0-9]+\thttp\t' summary.tsv" using 1:6 with linespoints dashtype 2 title "http p99", \
	     "< grep -P '^[0-9]+\thttp-chat\t' summary.tsv" using 1:6 with linespoints dashtype 2 title "http-chat p99"
	EOF
	(cd "$outdir" && gnuplot plot.gp) || echo "http_overhead: gnuplot failed" >&2
fi
}
[ "$repeat" = 0 ] && { report; exit 0; } # REPEAT 0: the report of an earlier run

tmp=$(mktemp -d /tmp/http-overhead.XXXXXX)
# stories260K has no chat template (gpud refuses chat on it): every mode
# runs on a copy that has one, the same weights and vocabulary
model=$tmp/model.gguf
python3 tests/integration/gguf_chat_template.py ../shared/models/stories260K.gguf "$model" \
	'{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}'
gpid= hpid=
cleanup() {
	# || true: under set -e a failed kill (one already dead) would end
	# the trap before the other is stopped
	[ -z "$hpid" ] || kill -TERM "$hpid" 2>/dev/null || true
	[ -z "$gpid" ] || kill -TERM "$gpid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib/port.sh"
port=$(pick_port) || { echo "http_overhead: no free port" >&2; exit 1; }
cat >"$tmp/swarm.json" <<EOF
{ "state_dir": "$tmp/state",
  "log": { "level": "warn" },
  "gpud": { "socket": "$tmp/gpud.sock", "model": "$model", "devices": ["cpu", "cpu"],
            "threads": 1, "prefix_cache_bytes": 0 },
  "http": { "listen": "127.0.0.1:$port", "max_connections": 1024 } }
EOF
mkdir -p "$tmp/state"
nice "$gpud" serve --config "$tmp/swarm.json" >"$tmp/gpud.log" 2>&1 &
gpid=$!
# start_http: gpud-http (again), once it answers /health with 200
start_http() {
	nice "$http" --config "$tmp/swarm.json" >>"$tmp/http.log" 2>&1 &
	hpid=$!
	for _ in $(seq 1 600); do
		[ -S "$tmp/gpud.sock" ] &&
			[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health")" = 200 ] && return 0
		sleep 0.1
	done
	tail -n 20 "$tmp/gpud.log" "$tmp/http.log"
	echo "http_overhead: gpud-http did not come up" >&2
	exit 1
}
start_http
crashes=0

{
	echo "# $(date -u +%FT%TZ) $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
	printf 'run\tmode\tclients\trequests\tok\tgen_tokens\tprompt_tokens\tcached_tokens\twall_s\ttokens_per_s\tttft_p50_ms\tttft_p99_ms\tlat_p50_ms\tlat_p99_ms\tgpud_cpu_s\tfront_cpu_s\ttool_cpu_s\n'
} >"$outdir/runs.tsv"
common=(--prompt-tokens 32:128 --max-tokens "${MAX_TOKENS:-32}" --causal --segments 1 --json
	--timeout 600)
status=0
for r in $(seq 1 "$repeat"); do
	for c in $clients; do
		req=$((6 * c))
		[ $req -lt "${MIN_REQUESTS:-24}" ] && req=${MIN_REQUESTS:-24}
		# the order turns with each repeat (what runs first meets a
		# machine that is a little different)
		case $((r % 3)) in
		1) modes="native http http-chat" ;;
		2) modes="http http-chat native" ;;
		0) modes="http-chat native http" ;;
		esac
		for mode in $modes; do
			case $mode in
			native) args=(--socket "$tmp/gpud.sock") ;;
			http) args=(--http "http://127.0.0.1:$port" --endpoint completions
				--socket "$tmp/gpud.sock" --front-pid "$hpid") ;;
			http-chat) args=(--http "http://127.0.0.1:$port" --endpoint chat
				--socket "$tmp/gpud.sock" --front-pid "$hpid") ;;
			esac
			# a run that gpud-http did not survive is done again (up to
			# twice) on a new one; each death is counted and its log kept
			for attempt in 1 2 3; do
				ok=1
				nice "$load" "${args[@]}" "${common[@]}" --requests $req \
					--concurrency "$c" --seed $((1000 + r)) >"$tmp/run.json" \
					2>"$tmp/run.err" || ok=0
				[ $ok = 1 ] && break
				echo "http_overhead: $mode c=$c run $r failed:" >&2
				head -n 5 "$tmp/run.err" >&2
				kill -0 "$hpid" 2>/dev/null && break
				hrc=0
				wait "$hpid" || hrc=$?
				crashes=$((crashes + 1))
				echo "http_overhead: gpud-http died (exit $hrc, death $crashes); log kept" \
					"in $outdir/gpud-http-death-$crashes.log; starting it again" >&2
				tail -n 40 "$tmp/http.log" >"$outdir/gpud-http-death-$crashes.log"
				: >"$tmp/http.log"
				start_http
				case $mode in
				http|http-chat) args[${#args[@]} - 1]=$hpid ;; # --front-pid
				esac
			done
			if [ $ok = 0 ]; then
				status=1
				[ -s "$tmp/run.json" ] || continue
			fi
			python3 - "$tmp/run.json" "$r" "$mode" "$c" >>"$outdir/runs.tsv" <<-'EOF'
			import json, sys
			d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
			print("\t".join(str(x) for x in [sys.argv[2], sys.argv[3], sys.argv[4],
			    d["requests"], d["ok"], d["generated_tokens"], d["prompt_tokens"],
			    d["cached_prompt_tokens"],
			    round(d["wall_s"], 3), round(d["tokens_per_s"], 1),
			    round(d["ttft_ms"]["p50"], 3), round(d["ttft_ms"]["p99"], 3),
			    round(d["latency_ms"]["p50"], 3), round(d["latency_ms"]["p99"], 3),
			    round(d["gpud_cpu_s"], 3), round(d["front_cpu_s"], 3),
			    round(d["tool_cpu_s"], 3)]))
			EOF
			tail -n 1 "$outdir/runs.tsv"
		done
	done
done

report
echo "gpud-http deaths during the runs: $crashes" | tee "$outdir/deaths.txt"
kill -TERM "$hpid" 2>/dev/null || true
wait "$hpid" || { echo "http_overhead: gpud-http did not exit 0 on SIGTERM" >&2; status=1; }
hpid=
exit $status
