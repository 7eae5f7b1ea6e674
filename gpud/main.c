/* main.c - the gpud command line.
 *
 *   gpud serve --config FILE [--check]                   the daemon (gpud/daemon.h)
 *   gpud generate --model PATH --prompt TEXT [options]   text continuation
 *   gpud tokenize --model PATH [--no-bos] TEXT            token ids
 *   gpud mkmodel --out PATH [options]                     random-weight model
 *   gpud quantize --model IN --out OUT --type T           a model in another type
 *   gpud --version
 *
 * Generated text goes
 * to stdout, everything else (timings, errors) to stderr; errors exit 1
 * (2 for usage errors).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/arena.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/privdrop.h"
#include "gpud/daemon.h"
#include "gpud/engine.h"
#include "gpud/gguf.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/quantize_model.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

#define EXIT_USAGE 2

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gpud serve [--config FILE] [--check] [--chat-format F]\n"
		"       gpud generate --model PATH --prompt TEXT [--max-tokens N]\n"
		"                     [--temperature T] [--seed S] [--threads N] [--top-k K]\n"
		"                     [--top-p P] [--min-p M] [--repeat-penalty R]\n"
		"                     [--penalty-last-n N] [--chat] [--context N]\n"
		"                     [--stop STRING]... [--chat-format F]\n"
		"                     [--device cpu|cuda:N] [--kv-type f32|f16]\n"
		"       gpud tokenize --model PATH [--no-bos] TEXT\n"
		"       gpud mkmodel --out PATH [--dim D] [--layers L] [--heads H] [--kv-heads K]\n"
		"                     [--head-dim D] [--ffn F] [--vocab-from GGUF | --vocab byte] [--type T|q4_k_m|q5_k_m]\n"
		"                     [--seed S] [--context N] [--rope-base B] [--tied]\n"
		"                     [--rope-scale F | --yarn F] [--arch llama|qwen2|qwen3] [--name S]\n"
		"                     [--preset tiny|llama-3.2-3b|qwen2.5-3b|qwen2.5-0.5b]\n"
		"       gpud quantize --model IN --out OUT --type T|q4_k_m|q5_k_m\n"
		"                     [--allow-requantize]\n"
		"       gpud --version\n"
		"chat formats (F): " GPUD_CHAT_NAMES "\n");
}

/* Parses a number or dies with a usage error naming the option. */
static double num(const char *opt, const char *s, double lo, double hi)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "gpud: --%s: bad value \"%s\" (expected %g..%g)\n", opt, s, lo, hi);
		exit(EXIT_USAGE);
	}
	return v;
}

/* gpud serve: configuration from FILE (defaults without one), then the
 * SWARM_* environment; --check (-n) validates and prints the memory plan. */
static int cmd_serve(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check", no_argument, NULL, 'n' },
		{ "chat-format", required_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *path = NULL, *chat_format = NULL;
	struct sw_config cfg;
	char err[SW_ERR_MAX] = "";
	bool check = false;
	int c, rc;

	while ((c = getopt_long(argc, argv, "c:n", opts, NULL)) != -1) {
		switch (c) {
		case 'c': path = optarg; break;
		case 'n': check = true; break;
		case 'f': chat_format = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "gpud serve: unexpected argument \"%s\"\n", argv[optind]);
		usage(stderr);
		return EXIT_USAGE;
	}
	sw_config_defaults(&cfg);
	rc = path ? sw_config_load_file(path, &cfg, err, sizeof(err)) : 0;
	if (!rc)
		rc = sw_config_apply_env(&cfg, err, sizeof(err));
	if (!rc && chat_format) { /* the command line over file and environment */
		enum gpud_chat_template t;
		if (gpud_chat_parse(chat_format, &t) != 0 ||
		    strlen(chat_format) >= sizeof(cfg.gpud.chat_format)) {
			fprintf(stderr, "gpud serve: --chat-format: unknown format \"%s\" (%s)\n",
				chat_format, GPUD_CHAT_NAMES);
			return EXIT_USAGE;
		}
		snprintf(cfg.gpud.chat_format, sizeof(cfg.gpud.chat_format), "%s", chat_format);
	}
	if (!rc)
		rc = sw_config_validate(&cfg, SW_CONFIG_NEED_MODEL, err, sizeof(err));
	if (rc) {
		fprintf(check ? stdout : stderr, "gpud: %s\n", err);
		return 1;
	}
	sw_log_init("gpud", (enum sw_log_level)cfg.log.level);
	if (!check && cfg.log.file[0]) {
		rc = sw_log_open(cfg.log.file);
		if (rc) {
			fprintf(stderr, "gpud: log.file %s: %s\n", cfg.log.file, sw_strerror(rc));
			return 1;
		}
	}
	/* as root with `user` set: that user from here on, before the model
	 * is read or the socket made (common/privdrop.h) */
	if (!check) {
		bool switched;

		rc = sw_privdrop(cfg.user, &switched, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "gpud: user: %s\n", err);
			log_error("user: %s", err);
			return 1;
		}
		if (switched)
			log_info("running as user %s (uid %u, gid %u)", cfg.user, (unsigned)getuid(),
				 (unsigned)getgid());
	}
	signal(SIGPIPE, SIG_IGN); /* a vanished client is an EPIPE, not a death */
	return gpud_serve(&cfg, check, stdout);
}

static int emit_stdout(void *arg, const char *text, size_t len)
{
	fwrite(text, 1, len, stdout);
	fflush(stdout);
	return 0;
}

/* --device: "cpu" or "cuda:N" into ep's kind and ordinal; -EINVAL else. */
static int parse_device(const char *s, struct gpud_engine_params *ep)
{
	char *end;
	unsigned long n;

	if (!strcmp(s, "cpu")) {
		ep->kind = SW_DEVICE_CPU;
		ep->ordinal = 0;
		return 0;
	}
	if (strncmp(s, "cuda:", 5) || s[5] < '0' || s[5] > '9')
		return -EINVAL;
	errno = 0;
	n = strtoul(s + 5, &end, 10);
	if (errno || *end || n > 255)
		return -EINVAL;
	ep->kind = SW_DEVICE_CUDA;
	ep->ordinal = (int)n;
	return 0;
}

static int cmd_generate(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "max-tokens", required_argument, NULL, 'n' },
		{ "temperature", required_argument, NULL, 't' },
		{ "seed", required_argument, NULL, 's' },
		{ "threads", required_argument, NULL, 'j' },
		{ "top-k", required_argument, NULL, 'k' },
		{ "top-p", required_argument, NULL, 'P' },
		{ "min-p", required_argument, NULL, 'M' },
		{ "repeat-penalty", required_argument, NULL, 'R' },
		{ "penalty-last-n", required_argument, NULL, 'L' },
		{ "context", required_argument, NULL, 'c' },
		{ "chat", no_argument, NULL, 'C' },
		{ "chat-format", required_argument, NULL, 'f' },
		{ "stop", required_argument, NULL, 'x' },
		{ "device", required_argument, NULL, 'd' },
		{ "kv-type", required_argument, NULL, 'K' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *model_path = NULL, *prompt = NULL, *stops[GPUD_STOP_MAX_STRINGS];
	struct gpud_engine_params ep;
	struct gpud_gen_params gp;
	struct gpud_gen_result res;
	struct gpud_model *m = NULL;
	struct gpud_engine *e = NULL;
	char err[SW_ERR_MAX] = "", *chat = NULL;
	enum gpud_chat_template choice = GPUD_CHAT_NONE; /* auto */
	bool use_chat = false;
	int c, rc;

	gpud_engine_params_default(&ep);
	ep.max_seqs = 1;
	gpud_gen_params_default(&gp);
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model_path = optarg; break;
		case 'p': prompt = optarg; break;
		case 'n': gp.max_tokens = (uint32_t)num("max-tokens", optarg, 0, 1 << 30); break;
		case 't': gp.sampling.temperature = (float)num("temperature", optarg, 0, 100); break;
		case 's': gp.sampling.seed = (uint64_t)num("seed", optarg, 0, 1.8e19); break;
		case 'j': ep.n_threads = (int)num("threads", optarg, 1, 1024); break;
		case 'k': gp.sampling.top_k = (int32_t)num("top-k", optarg, 0, 1 << 30); break;
		case 'P': gp.sampling.top_p = (float)num("top-p", optarg, 0, 1); break;
		case 'M': gp.sampling.min_p = (float)num("min-p", optarg, 0, 1); break;
		case 'R':
			gp.sampling.repeat_penalty = (float)num("repeat-penalty", optarg, 1e-3, 100);
			if (!gp.sampling.penalty_last_n)
				gp.sampling.penalty_last_n = 64; /* llama.cpp's window */
			break;
		case 'L':
			gp.sampling.penalty_last_n = (int32_t)num("penalty-last-n", optarg, 0,
								  GPUD_SAMPLER_MAX_PENALTY_LAST_N);
			break;
		case 'c': ep.n_ctx = (uint32_t)num("context", optarg, 1, 1 << 30); break;
		case 'C': use_chat = true; break;
		case 'f': /* implies --chat */
			if (gpud_chat_parse(optarg, &choice) != 0) {
				fprintf(stderr, "gpud generate: --chat-format: unknown format "
					"\"%s\" (%s)\n", optarg, GPUD_CHAT_NAMES);
				return EXIT_USAGE;
			}
			use_chat = true;
			break;
		case 'd':
			if (parse_device(optarg, &ep)) {
				fprintf(stderr, "gpud generate: --device: expected \"cpu\" or "
					"\"cuda:N\", got \"%s\"\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'K': /* gpud.kv_type's names */
			if (strcmp(optarg, "f32") && strcmp(optarg, "f16")) {
				fprintf(stderr, "gpud generate: --kv-type: expected \"f32\" or "
					"\"f16\", got \"%s\"\n", optarg);
				return EXIT_USAGE;
			}
			ep.kv_type = strcmp(optarg, "f16") ? GPUD_TYPE_F32 : GPUD_TYPE_F16;
			break;
		case 'x':
			if (gp.n_stop == GPUD_STOP_MAX_STRINGS) {
				fprintf(stderr, "gpud generate: at most %d --stop strings\n",
					GPUD_STOP_MAX_STRINGS);
				return EXIT_USAGE;
			}
			stops[gp.n_stop++] = optarg;
			gp.stop = stops;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (!model_path || !prompt || optind != argc) {
		fprintf(stderr, "gpud generate: --model and --prompt are required\n");
		usage(stderr);
		return EXIT_USAGE;
	}
	rc = gpud_model_load(&m, model_path, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud: %s\n", err);
		return 1;
	}
	if (use_chat) {
		const struct gpud_tokenizer *tok = gpud_model_tokenizer(m);
		enum gpud_chat_template tmpl;
		struct gpud_chat_msg msg = { .role = "user", .content = prompt };
		long n;

		rc = gpud_tokenizer_chat_resolve(tok, choice, &tmpl, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "gpud: %s: %s\n", model_path, err);
			goto out;
		}
		n = gpud_chat_format(tmpl, &msg, 1, true, NULL, 0);
		chat = n >= 0 ? malloc((size_t)n + 1) : NULL;
		if (!chat || gpud_chat_format(tmpl, &msg, 1, true, chat, (size_t)n + 1) != n) {
			fprintf(stderr, "gpud: cannot format the chat prompt\n");
			rc = 1;
			goto out;
		}
		prompt = chat;
		gp.parse_special = true;
		/* BOS: written by the format, else the vocab's to add */
		gp.no_bos = gpud_chat_writes_bos(tmpl);
	}
	rc = gpud_engine_create(&e, m, &ep, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud: %s: %s\n", model_path, err);
		goto out;
	}
	rc = gpud_engine_generate(e, prompt, strlen(prompt), &gp, emit_stdout, NULL, &res, err,
				  sizeof(err));
	if (rc) {
		fprintf(stderr, "\ngpud: %s: %s\n", model_path, err);
		goto out;
	}
	if (isatty(STDOUT_FILENO)) /* a pipe gets exactly the continuation */
		printf("\n");
	fflush(stdout);
	fprintf(stderr, "prompt tokens: %u, prefill: %.1f tok/s, generated: %u, decode: %.1f tok/s\n",
		res.n_prompt, res.prefill_s > 0 ? res.n_prompt / res.prefill_s : 0.0, res.n_gen,
		res.decode_s > 0 && res.n_gen > 1 ? (res.n_gen - 1) / res.decode_s : 0.0);
out:
	gpud_engine_destroy(e);
	gpud_model_free(m);
	free(chat);
	return rc ? 1 : 0;
}

static int cmd_tokenize(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "no-bos", no_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *path = NULL, *text;
	struct gpud_gguf *g = NULL;
	struct gpud_tokenizer *tok = NULL;
	struct sw_arena a = { 0 };
	int32_t *ids = NULL;
	size_t cap, n = 0;
	char err[SW_ERR_MAX] = "";
	bool bos = true;
	int c, rc;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm': path = optarg; break;
		case 'b': bos = false; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (!path || optind != argc - 1) {
		fprintf(stderr, "gpud tokenize: --model and one TEXT argument are required\n");
		usage(stderr);
		return EXIT_USAGE;
	}
	text = argv[optind];
	/* Only the tokenizer: vocab-only files have no tensors. */
	rc = gpud_gguf_open(&g, path, err, sizeof(err));
	if (!rc)
		rc = gpud_tokenizer_load(&tok, g, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud: %s\n", err);
		goto out;
	}
	cap = strlen(text) + 8;
	ids = malloc(cap * sizeof(*ids));
	rc = ids ? sw_arena_init(&a, 64 * strlen(text) + ((size_t)1 << 20)) : -ENOMEM;
	if (!rc)
		rc = gpud_tokenizer_encode(tok, text, strlen(text), bos ? GPUD_TOK_ADD_BOS : 0, ids,
					   cap, &n, &a);
	if (rc) {
		fprintf(stderr, "gpud: %s: tokenize: %s\n", path, sw_strerror(rc));
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		printf("%s%d", i ? " " : "", ids[i]);
	printf("\n");
out:
	sw_arena_destroy(&a);
	free(ids);
	gpud_tokenizer_free(tok);
	gpud_gguf_close(g);
	return rc ? 1 : 0;
}

static int cmd_mkmodel(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "out", required_argument, NULL, 'o' },
		{ "dim", required_argument, NULL, 'd' },
		{ "layers", required_argument, NULL, 'l' },
		{ "heads", required_argument, NULL, 'H' },
		{ "kv-heads", required_argument, NULL, 'K' },
		{ "head-dim", required_argument, NULL, 'D' },
		{ "ffn", required_argument, NULL, 'f' },
		{ "vocab-from", required_argument, NULL, 'V' },
		{ "vocab", required_argument, NULL, 'v' },
		{ "type", required_argument, NULL, 't' },
		{ "seed", required_argument, NULL, 's' },
		{ "context", required_argument, NULL, 'c' },
		{ "rope-base", required_argument, NULL, 'r' },
		{ "tied", no_argument, NULL, 'T' },
		{ "rope-scale", required_argument, NULL, 'S' },
		{ "yarn", required_argument, NULL, 'Y' },
		{ "preset", required_argument, NULL, 'R' },
		{ "arch", required_argument, NULL, 'A' },
		{ "name", required_argument, NULL, 'N' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct gpud_mkmodel_params p;
	char err[SW_ERR_MAX] = "";
	int c, rc;

	gpud_mkmodel_params_default(&p);
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'o': p.out = optarg; break;
		case 'd': p.dim = (uint32_t)num("dim", optarg, 1, 1 << 20); break;
		case 'l': p.n_layers = (uint32_t)num("layers", optarg, 1, 4096); break;
		case 'H': p.n_heads = (uint32_t)num("heads", optarg, 1, 4096); break;
		case 'K': p.n_kv_heads = (uint32_t)num("kv-heads", optarg, 1, 4096); break;
		case 'D': p.head_dim = (uint32_t)num("head-dim", optarg, 2, 1024); break;
		case 'f': p.ffn_dim = (uint32_t)num("ffn", optarg, 1, 1 << 22); break;
		case 'V': p.vocab_from = optarg; break;
		case 'v':
			if (strcmp(optarg, "byte")) {
				fprintf(stderr, "gpud mkmodel: --vocab: only \"byte\"\n");
				return EXIT_USAGE;
			}
			p.vocab_from = NULL;
			break;
		case 't':
			if (gpud_mkmodel_parse_type(optarg, &p.type, &p.mix)) {
				fprintf(stderr, "gpud mkmodel: --type: unknown type \"%s\" (" GPUD_MKMODEL_TYPE_NAMES ")\n",
					optarg);
				return EXIT_USAGE;
			}
			break;
		case 's': p.seed = (uint64_t)num("seed", optarg, 0, 1.8e19); break;
		case 'c': p.n_ctx = (uint32_t)num("context", optarg, 1, 1 << 30); break;
		case 'r': p.rope_base = (float)num("rope-base", optarg, 1, 1e12); break;
		case 'T': p.tied = true; break;
		case 'S': p.rope_scale_factor = (float)num("rope-scale", optarg, 0, 1e6); break;
		case 'Y': p.rope_yarn_factor = (float)num("yarn", optarg, 1, 1e6); break;
		case 'N': p.name = optarg; break;
		case 'A':
			if (gpud_arch_parse(optarg, strlen(optarg), &p.arch)) {
				fprintf(stderr, "gpud mkmodel: --arch: unknown \"%s\" "
					"(llama, qwen2 or qwen3)\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'R':
			if (gpud_mkmodel_preset(&p, optarg)) {
				fprintf(stderr, "gpud mkmodel: --preset: unknown \"%s\"\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (!p.out || optind != argc) {
		fprintf(stderr, "gpud mkmodel: --out is required\n");
		usage(stderr);
		return EXIT_USAGE;
	}
	if (p.rope_scale_factor > 0) { /* Llama 3's defaults for the rest */
		if (!p.rope_low_freq_factor)
			p.rope_low_freq_factor = 1;
		if (!p.rope_high_freq_factor)
			p.rope_high_freq_factor = 4;
		if (!p.rope_orig_ctx)
			p.rope_orig_ctx = 8192;
	}
	rc = gpud_mkmodel(&p, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud: %s\n", err);
		return 1;
	}
	return 0;
}

static int cmd_quantize(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "out", required_argument, NULL, 'o' },
		{ "type", required_argument, NULL, 't' },
		{ "allow-requantize", no_argument, NULL, 'a' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct gpud_quantize_params p = { .type = GPUD_TYPE_COUNT };
	struct gpud_quantize_report r;
	char err[SW_ERR_MAX] = "";
	int c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm': p.in = optarg; break;
		case 'o': p.out = optarg; break;
		case 't':
			if (gpud_mkmodel_parse_type(optarg, &p.type, &p.mix)) {
				fprintf(stderr, "gpud quantize: --type: unknown type \"%s\" ("
					GPUD_MKMODEL_TYPE_NAMES ")\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'a': p.allow_requantize = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (!p.in || !p.out || p.type == GPUD_TYPE_COUNT || optind != argc) {
		fprintf(stderr, "gpud quantize: --model, --out and --type are required\n");
		usage(stderr);
		return EXIT_USAGE;
	}
	if (gpud_quantize_model(&p, &r, err, sizeof(err))) {
		fprintf(stderr, "gpud: %s\n", err);
		return 1;
	}
	fprintf(stderr, "gpud quantize: %s: %llu tensors, %llu converted; %.1f MiB of tensors "
		"from %.1f MiB\n", p.out, (unsigned long long)r.tensors,
		(unsigned long long)r.converted, r.out_bytes / 1048576.0, r.in_bytes / 1048576.0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
		printf("gpud %s\n", SW_VERSION);
		return 0;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "serve"))
		return cmd_serve(argc - 1, argv + 1);
	if (!strcmp(argv[1], "generate"))
		return cmd_generate(argc - 1, argv + 1);
	if (!strcmp(argv[1], "tokenize"))
		return cmd_tokenize(argc - 1, argv + 1);
	if (!strcmp(argv[1], "mkmodel"))
		return cmd_mkmodel(argc - 1, argv + 1);
	if (!strcmp(argv[1], "quantize"))
		return cmd_quantize(argc - 1, argv + 1);
	fprintf(stderr, "gpud: unknown command \"%s\"\n", argv[1]);
	usage(stderr);
	return EXIT_USAGE;
}
