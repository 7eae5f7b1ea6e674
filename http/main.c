/* main.c - gpud-http, the OpenAI-compatible HTTP front of gpud.
 *
 *   gpud-http [--config FILE] [--listen HOST:PORT] [--socket GPUD_SOCKET]
 *             [--api-key-file PATH]
 *
 * The configuration is the swarm one (common/config.h): its http section
 * and gpud.socket; the flags override it. Exit status: 0 after SIGTERM or
 * SIGINT, 1 for a bad configuration or a failed start, 2 for bad usage.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "http/server.h"
#include "sw_config.h"

#define EXIT_USAGE 2

static void usage(FILE *f)
{
	fprintf(f, "usage: gpud-http [--config FILE] [--listen HOST:PORT] [--socket GPUD_SOCKET]\n"
		   "                 [--api-key-file PATH]\n"
		   "       gpud-http --version\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "listen", required_argument, NULL, 'l' },
		{ "socket", required_argument, NULL, 's' },
		{ "api-key-file", required_argument, NULL, 'k' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static struct http_server_opts o;
	const char *path = NULL, *listen = NULL, *sock = NULL, *keys = NULL;
	char err[SW_ERR_MAX] = "";
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'c': path = optarg; break;
		case 'l': listen = optarg; break;
		case 's': sock = optarg; break;
		case 'k': keys = optarg; break;
		case 'V': printf("gpud-http %s\n", SW_VERSION); return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "gpud-http: unexpected argument \"%s\"\n", argv[optind]);
		usage(stderr);
		return EXIT_USAGE;
	}
	sw_config_defaults(&o.cfg);
	rc = path ? sw_config_load_file(path, &o.cfg, err, sizeof(err)) : 0;
	if (!rc)
		rc = sw_config_apply_env(&o.cfg, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud-http: %s\n", err);
		return 1;
	}
	if (listen) {
		char host[SW_CONFIG_HOSTPORT_MAX];
		uint16_t port;
		if (strlen(listen) >= sizeof(o.cfg.http.listen) ||
		    sw_config_split_hostport(listen, host, sizeof(host), &port, err, sizeof(err))) {
			fprintf(stderr, "gpud-http: --listen \"%s\": expected \"HOST:PORT\" (an IPv4 "
				"address, [IPv6] or a host name; port 1..65535)\n", listen);
			return 1;
		}
		snprintf(o.cfg.http.listen, sizeof(o.cfg.http.listen), "%s", listen);
	}
	if (sock) {
		if (!sock[0] || strlen(sock) >= sizeof(o.cfg.gpud.socket)) {
			fprintf(stderr, "gpud-http: --socket: expected a path of 1..%zu bytes\n",
				sizeof(o.cfg.gpud.socket) - 1);
			return 1;
		}
		snprintf(o.cfg.gpud.socket, sizeof(o.cfg.gpud.socket), "%s", sock);
	}
	if (keys) {
		if (strlen(keys) >= sizeof(o.cfg.http.api_key_file)) {
			fprintf(stderr, "gpud-http: --api-key-file: path too long\n");
			return 1;
		}
		snprintf(o.cfg.http.api_key_file, sizeof(o.cfg.http.api_key_file), "%s", keys);
	}
	o.socket = o.cfg.gpud.socket;
	sw_log_init("gpud-http", (enum sw_log_level)o.cfg.log.level);
	if (o.cfg.log.file[0]) {
		rc = sw_log_open(o.cfg.log.file);
		if (rc) {
			fprintf(stderr, "gpud-http: log.file %s: %s\n", o.cfg.log.file, sw_strerror(rc));
			return 1;
		}
	}
	sw_log_install_sigusr1();
	signal(SIGPIPE, SIG_IGN);
	rc = http_serve(&o, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud-http: %s\n", err);
		log_error("%s", err);
		return 1;
	}
	return 0;
}
