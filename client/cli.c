/*
 * cli.c - the `memtally` command-line tool.
 *
 * A thin shell over the query library (memtally_query.h): parse the command
 * line, open one connection, ask, print. Each command prints either aligned
 * tables with IEC sizes for people or, with --json, exactly one JSON
 * document (built with jansson, never by hand) whose field names are an
 * interface: fields may be added, never renamed.
 *
 * Global options may come before or after the command, so the whole command
 * line is parsed by one getopt_long() pass in RETURN_IN_ORDER mode ("-" in
 * the option string): the first operand is the command, and options that
 * belong to one command only are checked against it afterwards. That mode
 * also keeps POSIXLY_CORRECT from stopping option parsing at the command.
 *
 * Exit status: 0 ok, 1 the server could not be reached or answered an
 * error (one line on stderr naming the socket), 2 a usage error (one line
 * on stderr). Nothing but the requested output goes to stdout.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "memtally.h"
#include "memtally_query.h"

enum {
	EXIT_SERVER = 1,
	EXIT_USAGE = 2,
};

/* Rows of the process table in `status`. */
#define STATUS_TOP_PROCESSES 5

struct cli {
	const char *socket;
	bool json;
	int timeout_ms;    /* 0: the library's default */
	const char *group; /* ps --group */
	memtally_query *q;
};

struct command {
	const char *name;
	int (*run)(struct cli *c);
	bool takes_group; /* accepts --group */
};

static void usage(FILE *f)
{
	fprintf(f,
	        "Usage: memtally [--socket PATH] [--json] [--timeout MS] "
	        "COMMAND\n"
	        "\n"
	        "Ask memtallyd how much heap memory the worker fleet holds.\n"
	        "\n"
	        "Commands:\n"
	        "  status           fleet bytes, limit, reserved, state, "
	        "groups, top processes\n"
	        "  ps [--group G]   one line per registered worker process\n"
	        "\n"
	        "Options (before or after the command):\n"
	        "  --socket PATH    server socket (default: $MEMTALLY_SOCKET, "
	        "else\n"
	        "                   " MEMTALLY_DEFAULT_SOCKET ")\n"
	        "  --json           print one JSON document instead of tables\n"
	        "  --timeout MS     give up on the server after MS "
	        "milliseconds (default %d)\n"
	        "  -h, --help       show this help and exit\n"
	        "  -V, --version    show the version and exit\n"
	        "\n"
	        "Exit status: 0 ok, 1 error talking to the server, 2 usage "
	        "error.\n",
	        MEMTALLY_QUERY_DEFAULT_TIMEOUT_MS);
}

/* One-line usage error; always returns EXIT_USAGE. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt,
                                                             ...)
{
	va_list ap;
	fputs("memtally: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (try 'memtally --help')\n", stderr);
	return EXIT_USAGE;
}

/* A failed query: name the socket, the error and the server's words. */
static int query_error(const struct cli *c, const char *what, int err)
{
	const char *msg = memtally_query_last_error(c->q);
	fprintf(stderr, "memtally: cannot %s from %s: %s%s%s\n", what,
	        c->socket, memtally_strerror(err), msg[0] ? ": " : "", msg);
	return EXIT_SERVER;
}

/* ---- human output -------------------------------------------------- */

/*
 * `v` bytes in IEC units with one decimal ("312.5 MiB"), plain bytes below
 * 1 KiB ("0 B"). A value that would round up to 1024.0 of a unit is shown
 * in the next unit instead.
 */
static const char *fmt_size(char buf[static 16], uint64_t v)
{
	static const char *const units[] = {"KiB", "MiB", "GiB",
	                                    "TiB", "PiB", "EiB"};
	if (v < 1024) {
		snprintf(buf, 16, "%" PRIu64 " B", v);
		return buf;
	}
	double d = (double)v / 1024;
	size_t u = 0;
	while (d >= 1023.95 && u + 1 < sizeof(units) / sizeof(units[0])) {
		d /= 1024;
		u++;
	}
	snprintf(buf, 16, "%.1f %s", d, units[u]);
	return buf;
}

static const char *fmt_limit(char buf[static 16], uint64_t v)
{
	return v ? fmt_size(buf, v) : "none";
}

/*
 * Print `s` left-aligned in `width` columns, control characters replaced
 * by '?': group names and comm come from other users' processes and must
 * not reach the terminal as escape sequences.
 */
static void put_clean(const char *s, int width)
{
	int n = 0;
	for (; *s; s++, n++)
		putchar((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s);
	for (; n < width; n++)
		putchar(' ');
}

/* Widen a column to fit `s`, up to 64 columns: a longer name only pushes
 * its own row out of line rather than every row. */
static int max_width(int w, const char *s)
{
	size_t n = strlen(s);
	return n > (size_t)w ? (n > 64 ? 64 : (int)n) : w;
}

static const char *process_flags(const struct memtally_process *p)
{
	if (p->over_limit && p->corrupt)
		return "OVER,CORRUPT";
	if (p->over_limit)
		return "OVER";
	if (p->corrupt)
		return "CORRUPT";
	return "-";
}

/* The process table of `ps`, and of `status` with at most `rows` rows. */
static void print_processes(const struct memtally_process *p, size_t n,
                            size_t rows)
{
	if (n > rows)
		n = rows;
	int gw = 5, fw = 5; /* strlen("GROUP"), strlen("FLAGS") */
	for (size_t i = 0; i < n; i++) {
		gw = max_width(gw, p[i].group);
		fw = max_width(fw, process_flags(&p[i]));
	}
	printf("%7s  ", "PID");
	put_clean("GROUP", gw);
	printf("  %10s  %10s  %10s  %7s  ", "BYTES", "PEAK", "LIMIT",
	       "THREADS");
	put_clean("FLAGS", fw);
	printf("  COMM\n");
	for (size_t i = 0; i < n; i++) {
		char b[16], pk[16], l[16];
		printf("%7" PRIu32 "  ", p[i].pid);
		put_clean(p[i].group, gw);
		printf("  %10s  %10s  %10s  %7" PRIu32 "  ",
		       fmt_size(b, p[i].bytes), fmt_size(pk, p[i].peak),
		       fmt_limit(l, p[i].limit), p[i].threads);
		put_clean(process_flags(&p[i]), fw);
		printf("  ");
		put_clean(p[i].comm, 0);
		putchar('\n');
	}
}

static void print_groups(const struct memtally_usage *u)
{
	int gw = 5; /* strlen("GROUP") */
	for (size_t i = 0; i < u->n_groups; i++)
		gw = max_width(gw, u->groups[i].name);
	put_clean("GROUP", gw);
	printf("  %10s  %10s  %10s  %-5s  %5s\n", "BYTES", "PEAK", "LIMIT",
	       "STATE", "PROCS");
	for (size_t i = 0; i < u->n_groups; i++) {
		const struct memtally_group_usage *g = &u->groups[i];
		char b[16], pk[16], l[16];
		put_clean(g->name, gw);
		printf("  %10s  %10s  %10s  %-5s  %5" PRIu32 "\n",
		       fmt_size(b, g->bytes), fmt_size(pk, g->peak),
		       fmt_limit(l, g->limit), memtally_state_name(g->state),
		       g->processes);
	}
}

static void print_status(const struct memtally_usage *u,
                         const struct memtally_process *p, size_t n)
{
	char b[16], e[16], pk[16], l[16], r[16];
	printf("fleet       %s ± %s  (peak %s)\n", fmt_size(b, u->bytes),
	       fmt_size(e, u->error_bytes), fmt_size(pk, u->peak));
	printf("limit       %s\n", fmt_limit(l, u->limit));
	printf("reserved    %s\n", fmt_size(r, u->reserved));
	printf("state       %s\n", memtally_state_name(u->state));
	printf("processes   %" PRIu32, u->processes);
	if (u->unregistered)
		printf(" (+%" PRIu32 " unregistered: no free slot)",
		       u->unregistered);
	putchar('\n');
	if (u->n_groups) {
		putchar('\n');
		print_groups(u);
	}
	if (n) {
		printf("\ntop processes\n");
		print_processes(p, n, STATUS_TOP_PROCESSES);
	}
}

/* ---- JSON output --------------------------------------------------- */

/* JSON integers are signed 64-bit in jansson; no real count reaches 2^63,
 * but a corrupt one must not turn negative. */
static json_int_t jint(uint64_t v)
{
	return v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v;
}

static json_t *jlimit(uint64_t v)
{
	return v ? json_integer(jint(v)) : json_null();
}

/*
 * A JSON string for `s`. jansson accepts only valid UTF-8, and names and
 * comm are arbitrary bytes, so an invalid string is sent with every
 * non-ASCII byte replaced by '?' rather than dropped or failing the
 * document.
 */
static json_t *jstr(const char *s)
{
	json_t *j = json_string(s);
	if (j)
		return j;
	char *copy = strdup(s);
	if (!copy)
		return NULL;
	for (char *c = copy; *c; c++)
		if ((unsigned char)*c >= 0x80)
			*c = '?';
	j = json_string(copy);
	free(copy);
	return j;
}

/*
 * The documents below are DESIGN.md's `--json` shapes; a field may be
 * added, never renamed. One key per line so the shape reads as JSON.
 */
static json_t *json_status(const struct memtally_usage *u)
{
	json_t *groups = json_array();
	if (!groups)
		return NULL;
	for (size_t i = 0; i < u->n_groups; i++) {
		const struct memtally_group_usage *g = &u->groups[i];
		/* clang-format off */
		json_t *jg = json_pack(
			"{s:o, s:I, s:I, s:o, s:s, s:I, s:I, s:I}",
			"name", jstr(g->name),
			"bytes", jint(g->bytes),
			"peak", jint(g->peak),
			"limit", jlimit(g->limit),
			"state", memtally_state_name(g->state),
			"processes", (json_int_t)g->processes,
			"reserved", jint(g->reserved),
			"error_bytes", jint(g->error_bytes));
		/* clang-format on */
		if (json_array_append_new(groups, jg) < 0)
			goto fail_put_groups;
	}
	/* clang-format off */
	return json_pack("{s:{s:I, s:I, s:o, s:I, s:s, s:I}, s:I, s:I, s:o, "
			 "s:I, s:I, s:I, s:I}",
		"fleet",
			"bytes", jint(u->bytes),
			"peak", jint(u->peak),
			"limit", jlimit(u->limit),
			"reserved", jint(u->reserved),
			"state", memtally_state_name(u->state),
			"error_bytes", jint(u->error_bytes),
		"processes", (json_int_t)u->processes,
		"unregistered", (json_int_t)u->unregistered,
		"groups", groups,
		"ticks", jint(u->ticks),
		"threshold", jint(u->threshold),
		"slots", (json_int_t)u->slots,
		"slots_free", (json_int_t)u->slots_free);
	/* clang-format on */

fail_put_groups:
	json_decref(groups);
	return NULL;
}

static json_t *json_processes(const struct memtally_process *p, size_t n)
{
	json_t *list = json_array();
	if (!list)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		/* clang-format off */
		json_t *jp = json_pack(
			"{s:I, s:o, s:I, s:I, s:o, s:b, s:I, s:o, s:b, s:I,"
			" s:I}",
			"pid", (json_int_t)p[i].pid,
			"group", jstr(p[i].group),
			"bytes", jint(p[i].bytes),
			"peak", jint(p[i].peak),
			"limit", jlimit(p[i].limit),
			"over_limit", (int)p[i].over_limit,
			"threads", (json_int_t)p[i].threads,
			"comm", jstr(p[i].comm),
			"corrupt", (int)p[i].corrupt,
			"uid", (json_int_t)p[i].uid,
			"error_bytes", jint(p[i].error_bytes));
		/* clang-format on */
		if (json_array_append_new(list, jp) < 0)
			goto fail_put_list;
	}
	return json_pack("{s:o}", "processes", list);

fail_put_list:
	json_decref(list);
	return NULL;
}

/* Print `doc` (a new reference, consumed; NULL after a failed build). */
static int print_json(json_t *doc)
{
	if (!doc) {
		fprintf(stderr, "memtally: cannot build the JSON document: "
		                "out of memory\n");
		return EXIT_SERVER;
	}
	int rc = json_dumpf(doc, stdout, JSON_INDENT(2));
	json_decref(doc);
	if (rc < 0 || putchar('\n') == EOF) {
		fprintf(stderr, "memtally: cannot write to stdout: %s\n",
		        strerror(errno));
		return EXIT_SERVER;
	}
	return 0;
}

/* ---- commands ------------------------------------------------------ */

static int by_bytes_desc(const void *a, const void *b)
{
	const struct memtally_process *x = a, *y = b;
	if (x->bytes != y->bytes)
		return x->bytes < y->bytes ? 1 : -1;
	return x->pid < y->pid ? -1 : x->pid > y->pid;
}

/* Largest first, then by pid, whatever order the server sent, so the
 * output is the same for the same figures. */
static void sort_processes(struct memtally_process *p, size_t n)
{
	if (n > 1)
		qsort(p, n, sizeof(*p), by_bytes_desc);
}

static int cmd_status(struct cli *c)
{
	struct memtally_usage *u = NULL;
	struct memtally_process *p = NULL;
	size_t n = 0;
	int rc = 0;
	int err = memtally_query_usage(c->q, &u);
	if (err)
		return query_error(c, "get usage", err);
	if (c->json) {
		rc = print_json(json_status(u));
		goto out_free_usage;
	}
	err = memtally_query_processes(c->q, NULL, &p, &n);
	if (err) {
		rc = query_error(c, "list processes", err);
		goto out_free_usage;
	}
	sort_processes(p, n);
	print_status(u, p, n);
	memtally_processes_free(p);

out_free_usage:
	memtally_usage_free(u);
	return rc;
}

static int cmd_ps(struct cli *c)
{
	struct memtally_process *p = NULL;
	size_t n = 0;
	int err = memtally_query_processes(c->q, c->group, &p, &n);
	if (err)
		return query_error(c, "list processes", err);
	sort_processes(p, n);
	int rc = 0;
	if (c->json)
		rc = print_json(json_processes(p, n));
	else
		print_processes(p, n, SIZE_MAX);
	memtally_processes_free(p);
	return rc;
}

static const struct command commands[] = {
    {"status", cmd_status, false},
    {"ps", cmd_ps, true},
};

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

/* ---- main ---------------------------------------------------------- */

enum {
	OPT_SOCKET = 256,
	OPT_JSON,
	OPT_TIMEOUT,
	OPT_GROUP,
	OPT_HELP,
	OPT_VERSION,
};

static const struct option long_options[] = {
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"json", no_argument, NULL, OPT_JSON},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"group", required_argument, NULL, OPT_GROUP},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static int parse_timeout(const char *s, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v <= 0 || v > INT_MAX)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

/* Finish stdout: a full disk or closed pipe is an error, not silence. */
static int close_stdout(int rc)
{
	if (fflush(stdout) == EOF || ferror(stdout)) {
		if (rc == 0)
			fprintf(stderr,
			        "memtally: cannot write to stdout: %s\n",
			        strerror(errno));
		return rc ? rc : EXIT_SERVER;
	}
	return rc;
}

int main(int argc, char **argv)
{
	struct cli c = {0};
	const char *cmd_name = NULL;
	const char *extra = NULL; /* first operand after the command */
	bool help = false, version = false;

	opterr = 0;
	int opt;
	while ((opt = getopt_long(argc, argv, "-:hV", long_options, NULL)) !=
	       -1) {
		switch (opt) {
		case 1: /* an operand, in order */
			if (!cmd_name)
				cmd_name = optarg;
			else if (!extra)
				extra = optarg;
			break;
		case OPT_SOCKET:
			if (!optarg[0])
				return usage_error("--socket needs a path");
			c.socket = optarg;
			break;
		case OPT_JSON:
			c.json = true;
			break;
		case OPT_TIMEOUT:
			if (parse_timeout(optarg, &c.timeout_ms))
				return usage_error("invalid --timeout '%s': "
				                   "expected milliseconds > 0",
				                   optarg);
			break;
		case OPT_GROUP:
			c.group = optarg;
			break;
		case 'h':
		case OPT_HELP:
			help = true;
			break;
		case 'V':
		case OPT_VERSION:
			version = true;
			break;
		case ':':
			return usage_error("option '%s' needs a value",
			                   argv[optind - 1]);
		default:
			/* getopt's optopt: 0 for an unknown long option, the
			 * option's value for "--json=1", else the short one. */
			if (optopt >= OPT_SOCKET)
				return usage_error(
				    "option '%.*s' takes no value",
				    (int)strcspn(argv[optind - 1], "="),
				    argv[optind - 1]);
			if (optopt == 0)
				return usage_error("unknown option '%s'",
				                   argv[optind - 1]);
			return usage_error("unknown option '-%c'", optopt);
		}
	}
	/* Operands after "--" are left for us at argv[optind..]. */
	for (; optind < argc; optind++) {
		if (!cmd_name)
			cmd_name = argv[optind];
		else if (!extra)
			extra = argv[optind];
	}

	if (help) {
		usage(stdout);
		return close_stdout(0);
	}
	if (version) {
		printf("memtally %s\n", MEMTALLY_VERSION_STRING);
		return close_stdout(0);
	}
	if (!cmd_name)
		return usage_error("no command given");
	const struct command *cmd = find_command(cmd_name);
	if (!cmd)
		return usage_error("unknown command '%s'", cmd_name);
	if (extra)
		return usage_error("%s: unexpected argument '%s'", cmd->name,
		                   extra);
	if (c.group && !cmd->takes_group)
		return usage_error("%s: --group applies to ps only", cmd->name);

	if (!c.socket)
		c.socket = memtally_query_default_socket();
	int err = memtally_query_open(&c.q, c.socket, c.timeout_ms);
	if (err) {
		bool down = err == -ENOENT || err == -ECONNREFUSED;
		fprintf(stderr, "memtally: cannot connect to %s: %s%s\n",
		        c.socket, memtally_strerror(err),
		        down ? " (is memtallyd running?)" : "");
		return EXIT_SERVER;
	}
	int rc = cmd->run(&c);
	memtally_query_close(c.q);
	return close_stdout(rc);
}
