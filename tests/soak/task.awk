# task.awk - the soak's task number n as one line of task JSON, drawn from
# seed and n alone (the same seed makes the same stream, whatever the
# timing). Pure awk, no I/O but its output, so the producer stays a loop.
#
# Variables (-v): seed, n, prefix (task ids are PREFIX-N), doc_mode
# ("text": summarize and answer may carry the document's text, one task
# per document; "document": summarize names a stored document), doc_id
# (a stored document the producer found; empty while none is stored, and
# then a summarize by document or an answer without text becomes an
# ingest), max_tokens, mix ("INGEST:SUMMARIZE:ANSWER:MALFORMED": the
# first three weigh the valid kinds; MALFORMED percent of the tasks, at
# fixed places, are malformed), doc_min and doc_max (the documents'
# sizes in bytes; default 1024 and 51200). seed is taken modulo 100000.
#
# Output: "CLASS KIND BYTES" on the first line (CLASS valid or
# malformed-WHAT, KIND ingest, summarize or answer, BYTES the document's
# size or 0), the JSON on the second. Documents are doc_min to doc_max
# bytes (by default 1-50 KB) of words
# from a fixed list in sentences of 5-15 words: nothing to escape in JSON.

function pick(a, n) { return a[int(rand() * n) + 1] }

function words_init(    s) {
	s = "the of and a to in is was that for on with as by at from his her it " \
	    "an were are which this be or had not but have one all their they " \
	    "river mountain harbour lamp keeper night storm ship tide wind stone " \
	    "village market bread salt iron copper clock bell tower road bridge " \
	    "winter summer spring autumn field garden orchard letter book map " \
	    "window door kitchen fire candle oil glass rope net boat sail coast " \
	    "island light signal weather cloud rain snow fog morning evening " \
	    "walked carried watched built kept opened closed wrote read counted " \
	    "measured mended painted crossed followed waited remembered found " \
	    "old new long short bright dark quiet loud small large careful " \
	    "distant narrow heavy warm cold early late every many few some"
	n_words = split(s, words, " ")
}

function text_of(bytes,    out, sent, k, i) {
	out = ""
	while (length(out) < bytes) {
		k = 5 + int(rand() * 11)
		sent = pick(words, n_words)
		sent = toupper(substr(sent, 1, 1)) substr(sent, 2)
		for (i = 1; i < k; i++)
			sent = sent " " pick(words, n_words)
		out = out (out == "" ? "" : " ") sent "."
	}
	return substr(out, 1, bytes)
}

function question(    q) {
	q[1] = "What did the keeper do at night?"
	q[2] = "Why was the bridge closed in winter?"
	q[3] = "Who carried the letters to the island?"
	q[4] = "What happened to the boat in the storm?"
	q[5] = "How was the harbour lamp kept bright?"
	q[6] = "When did the market open in spring?"
	return pick(q, 6)
}

BEGIN {
	# awk's srand takes a 32-bit seed: keep seed * 10007 + n under 2^31.
	srand((seed % 100000) * 10007 + n)
	words_init()
	split(mix, m, ":")
	id = prefix "-" n
	r = rand() * (m[1] + m[2] + m[3])
	if (doc_min == "")
		doc_min = 1024
	if (doc_max == "")
		doc_max = 51200
	# by default 1 KiB .. 50 KiB, the draws of the runs before doc_min
	bytes = doc_min + int(rand() * (doc_max - doc_min + 1))
	if (r < m[1])
		kind = "ingest"
	else if (r < m[1] + m[2])
		kind = "summarize"
	else
		kind = "answer"
	# Malformed: one task in every 100/MALFORMED, at fixed places, so that
	# every run of a few minutes has some (a draw may well have none).
	every = m[4] > 0 ? int(100 / m[4]) : 0
	if (every > 0 && n % every == int(every / 2))
		kind = "malformed"
	# One answer in three brings its own document (text mode only).
	answer_text = doc_mode == "text" && rand() < 1 / 3
	# Nothing stored yet: what would name or search a document is an
	# ingest instead (an answer over no documents fails, rightly).
	if (doc_id == "" && ((kind == "summarize" && doc_mode == "document") ||
			     (kind == "answer" && !answer_text)))
		kind = "ingest"

	if (kind == "ingest") {
		print "valid ingest " bytes
		printf "{\"id\": \"%s\", \"kind\": \"ingest\", \"text\": \"%s\"}\n", id, text_of(bytes)
	} else if (kind == "summarize") {
		if (doc_mode == "text") {
			print "valid summarize " bytes
			printf "{\"id\": \"%s\", \"kind\": \"summarize\", \"max_tokens\": %d, \"text\": \"%s\"}\n",
				id, max_tokens, text_of(bytes)
		} else {
			print "valid summarize 0"
			printf "{\"id\": \"%s\", \"kind\": \"summarize\", \"max_tokens\": %d, \"document_id\": %d}\n",
				id, max_tokens, doc_id
		}
	} else if (kind == "answer") {
		top_k = 1 + int(rand() * 8)
		if (answer_text) {
			bytes = int(bytes / 4) + doc_min
			print "valid answer " bytes
			printf "{\"id\": \"%s\", \"kind\": \"answer\", \"question\": \"%s\", \"top_k\": %d, \"max_tokens\": %d, \"text\": \"%s\"}\n",
				id, question(), top_k, max_tokens, text_of(bytes)
		} else {
			print "valid answer 0"
			printf "{\"id\": \"%s\", \"kind\": \"answer\", \"question\": \"%s\", \"top_k\": %d, \"max_tokens\": %d}\n",
				id, question(), top_k, max_tokens
		}
	} else {
		# Rotating through the ways a task can be wrong; each must end
		# "failed" with its error, never retried.
		w = int(n / every) % 5
		if (w == 0) {
			print "malformed-json ingest 0"
			printf "{\"id\": \"%s\", \"kind\": \"ingest\", \"text\": \"unterminated\n", id
		} else if (w == 1) {
			print "malformed-kind summarize 0"
			printf "{\"id\": \"%s\", \"kind\": \"sumarize\", \"document_id\": 1}\n", id
		} else if (w == 2) {
			print "malformed-noquestion answer 0"
			printf "{\"id\": \"%s\", \"kind\": \"answer\", \"top_k\": 3}\n", id
		} else if (w == 3) {
			print "malformed-type answer 0"
			printf "{\"id\": \"%s\", \"kind\": \"answer\", \"question\": \"%s\", \"top_k\": \"three\"}\n",
				id, question()
		} else {
			print "malformed-key ingest 0"
			printf "{\"id\": \"%s\", \"kind\": \"ingest\", \"text\": \"%s\", \"colour\": \"blue\"}\n",
				id, text_of(1024)
		}
	}
}
