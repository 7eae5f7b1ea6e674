# analyze.awk - is a memory series flat? The soak's one judgement,
# kept apart from tests/soak/run so that tests/soak/analyze_test.sh can
# feed it synthetic series (a flat one, a leaking one, a restart).
#
# Input: samples, one per line, "T SERIES VALUE" (T seconds since the
# start, SERIES a name without blanks, VALUE a number). A series
# "pid.ROLE" gives the process behind every series "KIND.ROLE"
# (rss.gpud, anon.gpud <- pid.gpud), sampled at the same T.
#
# Variables (-v):
#   from, to  the interval judged (seconds; the soak passes the second
#             half of the production phase)
#   window    trough window (seconds): a trough is the lowest sample of
#             one window. Peaks say little (a busy moment may fill
#             anything); a floor that keeps rising means something is
#             held for good.
#   check     regular expression of the series to judge
#   ignore    regular expression of series not to judge after all
#             (optional)
#   tol       tolerances, "PREFIX=ABS:REL[:SERIES:FACTOR],..." (longest
#             matching prefix wins): a series passes when the rise its
#             troughs' fitted line makes over the judged span is at most
#             max(ABS bytes, REL * the mean trough), plus FACTOR times
#             what SERIES rose over the same span when it rose (memory
#             that grows with something bounded, not with time: gpud's
#             bookkeeping of each pool block it touches for the first
#             time)
#   troughs   optional file: every series' troughs over the whole run
#             ("SERIES T TROUGH", for the plots)
#
# Method, per judged series: the samples in [from, to] from its last
# process (a pid change inside the interval is a restart: only the part
# after the last one is judged, and it must cover at least half the
# interval, else SHORT); windows of `window` seconds aligned to that
# part's first sample; windows with fewer than 3/4 of the fullest
# window's samples are dropped (a partial window's minimum of fewer
# samples is biased upwards); least squares over (mean time, trough) of
# at least 3 windows.
#
# Output, one line per judged series, tab-separated:
#   SERIES VERDICT TROUGHS MEAN SLOPE_PER_S RISE TOL RESTARTS FIRST LAST
#   ALLOWANCE (the part of TOL from the companion series)
# VERDICT is ok, RISING (rise > tol) or SHORT (too little to judge).
# Exit status 0 when every series is ok, 1 otherwise.

function tol_of(name,    i, n, parts, kv, best, bestlen, p) {
	best = ""
	bestlen = -1
	n = split(tol, parts, ",")
	for (i = 1; i <= n; i++) {
		split(parts[i], kv, "=")
		p = kv[1]
		if (substr(name, 1, length(p)) == p && length(p) > bestlen) {
			best = kv[2]
			bestlen = length(p)
		}
	}
	return best
}

function role_of(name) {
	sub(/^[^.]*\./, "", name)
	return name
}

{
	t = $1 + 0
	s = $2
	v = $3 + 0
	if (!(s in n_of))
		order[n_series++] = s
	k = n_of[s]++
	T[s, k] = t
	V[s, k] = v
	if (s ~ /^pid\./)
		PID[role_of(s), t] = v
}

# What series c rose from its first to its last sample in [t1, t2]
# (0 when it fell or has no samples there).
function rise_of(c, t1, t2,    i, first, last, seen) {
	seen = 0
	for (i = 0; i < n_of[c]; i++) {
		if (T[c, i] < t1 || T[c, i] > t2)
			continue
		if (!seen)
			first = V[c, i]
		last = V[c, i]
		seen = 1
	}
	return (seen && last > first) ? last - first : 0
}

# Troughs of series s over samples [a, b) from time t0 on: fills wt[],
# wv[] and returns their number.
function troughs_of(s, a, b, t0,    i, w, nw, cnt, mn, sumt, maxcnt, out, key) {
	delete cnt
	delete mn
	delete sumt
	nw = -1
	for (i = a; i < b; i++) {
		w = int((T[s, i] - t0) / window)
		if (!(w in cnt)) {
			cnt[w] = 0
			mn[w] = V[s, i]
			sumt[w] = 0
		}
		cnt[w]++
		sumt[w] += T[s, i]
		if (V[s, i] < mn[w])
			mn[w] = V[s, i]
		if (w > nw)
			nw = w
	}
	maxcnt = 0
	for (key in cnt)
		if (cnt[key] > maxcnt)
			maxcnt = cnt[key]
	out = 0
	for (w = 0; w <= nw; w++) {
		if (!(w in cnt) || cnt[w] < 0.75 * maxcnt)
			continue
		wt[out] = sumt[w] / cnt[w]
		wv[out] = mn[w]
		out++
	}
	return out
}

END {
	bad = 0
	for (j = 0; j < n_series; j++) {
		s = order[j]
		role = role_of(s)
		if (troughs != "" && s !~ /^pid\./) {
			delete wt
			delete wv
			m = troughs_of(s, 0, n_of[s], T[s, 0])
			for (i = 0; i < m; i++)
				printf "%s %.1f %.17g\n", s, wt[i], wv[i] > troughs
		}
		if (s !~ check || (ignore != "" && s ~ ignore))
			continue

		# The samples inside [from, to], and where the last process began.
		a = -1
		b = 0
		restarts = 0
		start = -1
		prev = ""
		for (i = 0; i < n_of[s]; i++) {
			if (T[s, i] < from || T[s, i] > to)
				continue
			if (a < 0)
				a = i
			b = i + 1
			p = ((role, T[s, i]) in PID) ? PID[role, T[s, i]] : ""
			if (prev != "" && p != prev) {
				restarts++
				start = i
			}
			prev = p
		}
		if (start < 0)
			start = a
		verdict = "ok"
		m = 0
		mean = slope = rise = 0
		tl = tol_of(s)
		delete at
		split(tl, at, ":")
		if (a < 0 || T[s, b - 1] - T[s, start] < 0.5 * (to - from)) {
			verdict = "SHORT"
		} else {
			delete wt
			delete wv
			m = troughs_of(s, start, b, T[s, start])
			if (m < 3) {
				verdict = "SHORT"
			} else {
				sx = sy = sxx = sxy = 0
				for (i = 0; i < m; i++) {
					sx += wt[i]
					sy += wv[i]
				}
				mx = sx / m
				mean = sy / m
				for (i = 0; i < m; i++) {
					sxx += (wt[i] - mx) * (wt[i] - mx)
					sxy += (wt[i] - mx) * (wv[i] - mean)
				}
				slope = sxx > 0 ? sxy / sxx : 0
				rise = slope * (T[s, b - 1] - T[s, start])
			}
		}
		limit = at[1] + 0
		if (at[2] * mean > limit)
			limit = at[2] * mean
		allow = 0
		if (at[3] != "" && verdict == "ok")
			allow = at[4] * rise_of(at[3], T[s, start], T[s, b - 1])
		limit += allow
		if (verdict == "ok" && rise > limit)
			verdict = "RISING"
		if (verdict != "ok")
			bad = 1
		printf "%s\t%s\t%d\t%.0f\t%.6g\t%.0f\t%.0f\t%d\t%.17g\t%.17g\t%.0f\n", s, verdict,
			m, mean, slope, rise, limit, restarts, (a < 0 ? 0 : V[s, a]),
			(a < 0 ? 0 : V[s, b - 1]), allow
	}
	exit bad
}
