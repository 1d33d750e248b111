/*
 * main.c - memtallyd: command line, signals, the loop.
 *
 * Exit status: 0 after a clean stop (SIGTERM/SIGINT), 1 when the server
 * cannot start (socket taken by a live server, segment in use, no
 * permission), 2 for a bad flag or value (one line on stderr naming it).
 * A second SIGTERM/SIGINT during shutdown gets the default action: the
 * signal handles are closed by then, on purpose, so a stuck stop can still
 * be interrupted.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "server.h"

#define EXIT_USAGE 2

/* Workers may hold up to threshold x threads unflushed: past 1 GiB the
 * totals would say little. */
#define THRESHOLD_MAX (UINT64_C(1) << 30)

static void usage(FILE *f)
{
	fprintf(f,
	        "Usage: memtallyd [OPTIONS]\n"
	        "Memory accounting server for a fleet of worker processes.\n"
	        "\n"
	        "  --socket PATH       Unix socket to listen on (default %s);\n"
	        "                      its directory is created (0755) if "
	        "missing\n"
	        "  --segment NAME      shared-memory segment (default %s)\n"
	        "  --slots N           worker slots, 1..%u (default %u)\n"
	        "  --lanes N           per-thread lanes per slot, 1..%u "
	        "(default %u)\n"
	        "  --tick MS           aggregation period, 1..%u ms (default "
	        "%u)\n"
	        "  --threshold SIZE    worker flush threshold, 1 B..1 GiB "
	        "(default 64KiB)\n"
	        "  --log-level LEVEL   debug, info, warn or error (default "
	        "info)\n"
	        "  --reset             re-create the segment; this version "
	        "always does\n"
	        "                      (adopting a running segment comes "
	        "later)\n"
	        "  --help              this text\n"
	        "  --version           print the version\n"
	        "\n"
	        "SIZE is bytes with an optional unit: K, M, G, T and KiB, MiB, "
	        "GiB, TiB\n"
	        "are powers of 1024; KB, MB, GB, TB are powers of 1000 "
	        "(64KiB, 1.5G, 512MB).\n"
	        "Logs are logfmt lines on stderr. SIGTERM or SIGINT stop the "
	        "server and\n"
	        "leave the segment in /dev/shm.\n",
	        MTS_DEFAULT_SOCKET, MTS_DEFAULT_SEGMENT, MTSHM_MAX_SLOTS,
	        MTS_DEFAULT_SLOTS, MTSHM_MAX_LANES, MTSHM_DEFAULT_LANES,
	        MTS_TICK_MAX_MS, MTS_DEFAULT_TICK_MS);
}

static void bad_value(const char *flag, const char *value, const char *want)
{
	fprintf(stderr, "memtallyd: %s: %s, got '%s'\n", flag, want, value);
	exit(EXIT_USAGE);
}

static uint32_t parse_u32(const char *flag, const char *s, uint32_t lo,
                          uint32_t hi)
{
	char want[80];
	snprintf(want, sizeof(want), "expected an integer from %u to %u", lo,
	         hi);
	if (*s < '0' || *s > '9')
		bad_value(flag, s, want);
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		bad_value(flag, s, want);
	return (uint32_t)v;
}

static bool segment_name_ok(const char *s)
{
	/* POSIX: one leading slash, no other, fits a file name. */
	return s[0] == '/' && s[1] && !strchr(s + 1, '/') &&
	       strlen(s) <= NAME_MAX;
}

enum {
	OPT_SOCKET = 256,
	OPT_SEGMENT,
	OPT_SLOTS,
	OPT_LANES,
	OPT_TICK,
	OPT_THRESHOLD,
	OPT_LOG_LEVEL,
	OPT_RESET,
	OPT_VERSION,
};

static const struct option options[] = {
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"segment", required_argument, NULL, OPT_SEGMENT},
    {"slots", required_argument, NULL, OPT_SLOTS},
    {"lanes", required_argument, NULL, OPT_LANES},
    {"tick", required_argument, NULL, OPT_TICK},
    {"threshold", required_argument, NULL, OPT_THRESHOLD},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"reset", no_argument, NULL, OPT_RESET},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static void parse_args(int argc, char **argv, struct mts_config *cfg)
{
	*cfg = (struct mts_config){
	    .socket_path = MTS_DEFAULT_SOCKET,
	    .segment = MTS_DEFAULT_SEGMENT,
	    .slots = MTS_DEFAULT_SLOTS,
	    .lanes = MTSHM_DEFAULT_LANES,
	    .tick_ms = MTS_DEFAULT_TICK_MS,
	    .threshold = MTS_DEFAULT_THRESHOLD,
	};
	enum mts_log_level level = MTS_LOG_INFO;
	opterr = 0; /* our own one-line messages */
	for (;;) {
		int opt = getopt_long(argc, argv, ":h", options, NULL);
		if (opt == -1)
			break;
		switch (opt) {
		case OPT_SOCKET:
			if (!optarg[0] ||
			    strlen(optarg) >=
			        sizeof(((struct sockaddr_un *)0)->sun_path))
				bad_value("--socket", optarg,
				          "expected a path of 1 to 107 bytes");
			cfg->socket_path = optarg;
			break;
		case OPT_SEGMENT:
			if (!segment_name_ok(optarg))
				bad_value("--segment", optarg,
				          "expected a name like /memtally");
			cfg->segment = optarg;
			break;
		case OPT_SLOTS:
			cfg->slots =
			    parse_u32("--slots", optarg, 1, MTSHM_MAX_SLOTS);
			break;
		case OPT_LANES:
			cfg->lanes =
			    parse_u32("--lanes", optarg, 1, MTSHM_MAX_LANES);
			break;
		case OPT_TICK:
			cfg->tick_ms =
			    parse_u32("--tick", optarg, 1, MTS_TICK_MAX_MS);
			break;
		case OPT_THRESHOLD: {
			uint64_t v;
			if (mt_parse_size(optarg, &v) < 0 || v == 0 ||
			    v > THRESHOLD_MAX)
				bad_value("--threshold", optarg,
				          "expected a size from 1 byte to "
				          "1GiB, e.g. 64KiB");
			cfg->threshold = v;
			break;
		}
		case OPT_LOG_LEVEL:
			if (mts_log_parse_level(optarg, &level) < 0)
				bad_value(
				    "--log-level", optarg,
				    "expected debug, info, warn or error");
			break;
		case OPT_RESET:
			cfg->reset = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case OPT_VERSION:
			printf("memtallyd %s\n", MTS_VERSION);
			exit(0);
		case ':':
			fprintf(stderr, "memtallyd: %s: missing value\n",
			        argv[optind - 1]);
			exit(EXIT_USAGE);
		default:
			fprintf(stderr,
			        "memtallyd: unknown option '%s' (see --help)\n",
			        argv[optind - 1]);
			exit(EXIT_USAGE);
		}
	}
	if (optind < argc) {
		fprintf(stderr, "memtallyd: unexpected argument '%s'\n",
		        argv[optind]);
		exit(EXIT_USAGE);
	}
	mts_log_set_level(level);
}

struct signals {
	uv_signal_t term;
	uv_signal_t intr;
	struct mts_server *srv;
};

static void on_signal(uv_signal_t *h, int signum)
{
	struct signals *s = h->data;
	mts_log(MTS_LOG_INFO, "shutting down", "signal=%s",
	        signum == SIGTERM ? "SIGTERM" : "SIGINT");
	mts_server_stop(s->srv);
	uv_close((uv_handle_t *)&s->term, NULL);
	uv_close((uv_handle_t *)&s->intr, NULL);
}

int main(int argc, char **argv)
{
	struct mts_config cfg;
	char q1[MTS_LOGQ_MAX], q2[MTS_LOGQ_MAX];
	parse_args(argc, argv, &cfg);
	/* A peer that hangs up mid-write must not kill the server. */
	signal(SIGPIPE, SIG_IGN);

	mts_log(MTS_LOG_INFO, "memtallyd starting",
	        "version=%s pid=%d socket=%s segment=%s slots=%u lanes=%u "
	        "tick_ms=%u threshold=%llu",
	        MTS_VERSION, (int)getpid(),
	        mts_logq(q1, sizeof(q1), cfg.socket_path),
	        mts_logq(q2, sizeof(q2), cfg.segment), cfg.slots, cfg.lanes,
	        cfg.tick_ms, (unsigned long long)cfg.threshold);

	int err = mts_socket_prepare(cfg.socket_path);
	if (err < 0) {
		const char *why =
		    err == -EADDRINUSE ? "another server is listening on the "
		                         "socket"
		    : err == -EEXIST   ? "socket path exists and is not a "
		                         "socket"
		                       : strerror(-err);
		mts_log(MTS_LOG_ERROR, "cannot use socket", "path=%s err=%s",
		        mts_logq(q1, sizeof(q1), cfg.socket_path),
		        mts_logq(q2, sizeof(q2), why));
		return 1;
	}

	uv_loop_t loop;
	err = uv_loop_init(&loop);
	if (err < 0) {
		mts_log(MTS_LOG_ERROR, "cannot start the event loop", "err=%s",
		        uv_err_name(err));
		return 1;
	}
	struct mts_server srv;
	err = mts_server_init(&srv, &loop, &cfg);
	if (err < 0) {
		uv_run(&loop, UV_RUN_DEFAULT); /* finish closing handles */
		mts_server_free(&srv);
		uv_loop_close(&loop);
		return 1;
	}

	struct signals sig = {.srv = &srv};
	uv_signal_init(&loop, &sig.term);
	uv_signal_init(&loop, &sig.intr);
	sig.term.data = sig.intr.data = &sig;
	uv_signal_start(&sig.term, on_signal, SIGTERM);
	uv_signal_start(&sig.intr, on_signal, SIGINT);

	mts_log(MTS_LOG_INFO, "listening", "socket=%s segment=%s",
	        mts_logq(q1, sizeof(q1), cfg.socket_path),
	        mts_logq(q2, sizeof(q2), cfg.segment));
	uv_run(&loop, UV_RUN_DEFAULT);

	uint64_t registrations = srv.reg.registrations;
	uint64_t exits = srv.reg.exits;
	mts_server_free(&srv);
	err = uv_loop_close(&loop);
	if (err < 0)
		mts_log(MTS_LOG_ERROR, "handles left open at exit", "err=%s",
		        uv_err_name(err));
	mts_log(MTS_LOG_INFO, "stopped", "registrations=%llu exits=%llu",
	        (unsigned long long)registrations, (unsigned long long)exits);
	return err < 0 ? 1 : 0;
}
