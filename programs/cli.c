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
 * on stderr), 3 `admit` was denied (the answer, with its figures, on
 * stdout). Nothing but the requested output goes to stdout.
 *
 * `run` (cli_run.c) is the exception to all of this: it starts a command,
 * connects by itself, fails open, writes nothing to stdout (the command's),
 * and exits with the command's status.
 *
 * `watch` streams: one line per event, flushed as it comes, so it can feed
 * a pipe; with --json each line is one compact JSON document. It waits for
 * events without a deadline unless --timeout is given.
 */
#define _GNU_SOURCE

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include <jansson.h>

#include "cli_run.h"
#include "memtally.h"
#include "memtally_query.h"
#include "mtcommon.h"
#include "query_msg.h"

enum {
	EXIT_SERVER = 1,
	EXIT_USAGE = 2,
	EXIT_DENIED = 3,
};

/* Operands a command takes at most (`limit set group NAME SIZE`). */
#define MAX_OPERANDS 4

/* Rows of the process table in `status`. */
#define STATUS_TOP_PROCESSES 5

struct cli {
	const char *socket;
	const char *tcp;   /* --tcp HOST:PORT, instead of the socket */
	const char *token; /* $MEMTALLY_TOKEN or --token-file's (TCP admin) */
	const char *token_file; /* --token-file PATH */
	char token_buf[1024];   /* the token read from token_file */
	const char *where;      /* the server, for messages */
	bool json;
	int timeout_ms;                 /* 0: the library's default */
	const char *group;              /* ps --group, admit --group */
	const char *bytes;              /* admit --bytes */
	const char *task;               /* admit --task */
	const char *kind;               /* admit, run --kind; kinds NAME */
	const char *ttl;                /* admit --ttl */
	const char *interval;           /* top --interval SECONDS */
	const char *iterations;         /* top --iterations N */
	const char *wait;               /* run --wait SECONDS */
	char **run_argv;                /* run: the command, NULL-terminated */
	const char *args[MAX_OPERANDS]; /* operands after the command */
	int nargs;
	memtally_query *q;

	/* Parsed by the command's check(), before connecting. */
	struct memtally_admit_req admit;
	enum memtally_scope scope;
	uint32_t pid;
	uint64_t limit;
	/* "fleet", "group:NAME", "pid:N" as events say; a whole name */
	char label[sizeof("group:") + MT_NAME_MAX];
	double wait_s;           /* run --wait */
	double interval_s;       /* top --interval */
	long iterations_n;       /* top --iterations; 0: until interrupted */
	const char *poll;        /* run --poll, as given */
	double poll_s;           /* run --poll; 0: the default */
	const char *retry;       /* run --retry, as given */
	uint32_t retry_n;        /* run --retry */
	const char *reservation; /* run --reservation ID */
	bool socket_given;       /* run: --socket was given */
	const char *reconnect;   /* watch --reconnect ("" when given) */
	bool lost;               /* watch: the stream was lost, not back */
	uint64_t events;         /* watch: events printed */
};

/* Options that belong to some commands only. */
enum {
	TAKES_GROUP = 1 << 0,
	TAKES_BYTES = 1 << 1,
	TAKES_TASK = 1 << 2,
	TAKES_TTL = 1 << 3,
	TAKES_REFRESH = 1 << 4, /* --interval, --iterations */
	TAKES_WAIT = 1 << 5,
	TAKES_KIND = 1 << 6,
	TAKES_RESERVATION = 1 << 7,
	TAKES_RECONNECT = 1 << 8,
};

struct command {
	const char *name;
	int (*check)(struct cli *c); /* NULL, or parse operands: 0 or
	                              * EXIT_USAGE, before connecting */
	int (*run)(struct cli *c);
	unsigned takes; /* TAKES_* */
	int min_args, max_args;
	bool streams; /* no deadline unless --timeout is given */
};

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "Usage: memtally [--socket PATH | --tcp HOST:PORT] [--json] "
	    "[--timeout MS] COMMAND\n"
	    "\n"
	    "Ask memtallyd how much heap memory the worker fleet holds, "
	    "and whether a\n"
	    "task may start.\n"
	    "\n"
	    "Commands:\n"
	    "  status           fleet bytes, RSS, limit, reserved, state, "
	    "groups,\n"
	    "                   top processes\n"
	    "  ps [--group G]   one line per registered worker process\n"
	    "  admit [--bytes SIZE] [--kind K] [--group G] [--task T] "
	    "[--ttl SECONDS]\n"
	    "                   ask to start a task; prints the reservation "
	    "id, or\n"
	    "                   why not with the figures (exit status 3); "
	    "with --kind,\n"
	    "                   memtallyd reserves the kind's learned size\n"
	    "  kinds [KIND]     learned sizes: runs, size, last peaks, "
	    "evictions\n"
	    "  release ID       end a reservation before its TTL\n"
	    "  limit set fleet SIZE | group NAME SIZE | pid PID SIZE\n"
	    "                   change a limit; SIZE none or 0 removes it "
	    "(a pid's: the\n"
	    "                   default per-process limit applies again; "
	    "needs root,\n"
	    "                   memtallyd's user or an admin uid/gid)\n"
	    "  watch [--reconnect]\n"
	    "                   print every state change as it happens "
	    "(--reconnect:\n"
	    "                   across memtallyd's restarts)\n"
	    "  top [--interval S] [--iterations N]\n"
	    "                   status and ps refreshed in place, largest "
	    "first\n"
	    "  run [--bytes SIZE] [--kind K] [--group G] [--task T] "
	    "[--wait SECONDS\n"
	    "      [--poll S]] [--ttl S] [--retry N] [--reservation ID] -- "
	    "CMD [ARGS...]\n"
	    "                   run CMD under the preload as task T (with "
	    "--bytes or\n"
	    "                   --kind: once\n"
	    "                   admitted, waiting up to --wait for room; "
	    "exit 3 if\n"
	    "                   denied); signals are forwarded, the "
	    "reservation released\n"
	    "                   at its end (TTL default %u s); exits with "
	    "CMD's status\n"
	    "                   (128+N for signal N). Without memtallyd "
	    "CMD runs anyway.\n"
	    "                   --poll S: while waiting, ask at least "
	    "every S seconds\n"
	    "                   (default 2). Evicted by memtallyd's node "
	    "guard: the\n"
	    "                   figures on stderr, exit 75 (EX_TEMPFAIL); "
	    "--retry N runs\n"
	    "                   it again up to N times first. "
	    "--reservation ID\n"
	    "                   --task T: a scheduler admitted T already "
	    "(admit --task T\n"
	    "                   printed ID): run under it, release it at "
	    "the end\n"
	    "\n"
	    "SIZE is bytes or a number with a unit: K, M, G, T and KiB, "
	    "MiB, GiB, TiB\n"
	    "are powers of 1024, KB, MB, GB, TB powers of 1000 (64KiB, "
	    "512MiB, 1.5G).\n"
	    "\n"
	    "Options (before or after the command):\n"
	    "  --socket PATH    server socket (default: $MEMTALLY_SOCKET, "
	    "else\n"
	    "                   " MEMTALLY_DEFAULT_SOCKET ")\n"
	    "  --tcp HOST:PORT  talk to memtallyd's TCP listener instead\n"
	    "  --token-file PATH  read memtallyd's tcp_token from PATH (its "
	    "first line)\n"
	    "                   instead of $MEMTALLY_TOKEN; the token is sent "
	    "with every\n"
	    "                   request (a command line is readable by every "
	    "user: no\n"
	    "                   --token VALUE)\n"
	    "  --json           print one JSON document instead of tables "
	    "(watch:\n"
	    "                   one per line)\n"
	    "  --timeout MS     give up on the server after MS "
	    "milliseconds (default %d;\n"
	    "                   watch: none; given, a wait for an event "
	    "longer\n"
	    "                   than MS ends the watch)\n"
	    "  -h, --help       show this help and exit\n"
	    "  -V, --version    show the version and exit\n"
	    "\n"
	    "Exit status: 0 ok, 1 error talking to the server, 2 usage "
	    "error,\n"
	    "3 admission denied; run: CMD's.\n",
	    MTCLI_RUN_DEFAULT_TTL_S, MEMTALLY_QUERY_DEFAULT_TIMEOUT_MS);
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

/* A failed query: name the server, the error and the server's words. */
static int query_error(const struct cli *c, const char *what, int err)
{
	char said[512];
	const char *msg =
	    mtcli_clean(said, sizeof(said), memtally_query_last_error(c->q));
	const char *hint = "";
	if (err == MEMTALLY_EPERM && !msg[0])
		hint = c->tcp
		           ? " (over TCP: $MEMTALLY_TOKEN or --token-file)"
		           : " (needs root, memtallyd's user or a configured "
		             "admin uid/gid)";
	fprintf(stderr, "memtally: cannot %s via %s: %s%s%s%s\n", what,
	        c->where, memtally_strerror(err), msg[0] ? ": " : "", msg,
	        hint);
	return EXIT_SERVER;
}

/* ---- human output -------------------------------------------------- */

/* `v` bytes for people ("312.5 MiB", "1 GiB", "0 B"): common/'s
 * formatter, as the server's messages use. */
static const char *fmt_size(char buf[static 16], uint64_t v)
{
	return mt_format_size(buf, 16, v);
}

static const char *fmt_limit(char buf[static 16], uint64_t v)
{
	return v ? fmt_size(buf, v) : "none";
}

/* A growth rate: "+40 MiB/s", "-1.5 KiB/s", "0 B/s". */
static const char *fmt_rate(char buf[static 24], double v)
{
	char b[16];
	double a = fabs(v);
	uint64_t n = isfinite(a) && a < 1.8e19 ? (uint64_t)(a + 0.5) : 0;
	const char *sign = n == 0 ? "" : v < 0 ? "-" : "+";
	snprintf(buf, 24, "%s%s/s", sign, fmt_size(b, n));
	return buf;
}

/* Seconds to the limit: "42 s", "12 min", "3.5 h", "9 d"; "—" for no
 * forecast. */
static const char *fmt_eta(char buf[static 16], double s)
{
	if (!(s > 0))
		return "\u2014";
	if (s < 99.5)
		snprintf(buf, 16, "%.0f s", s < 1 ? 1 : s);
	else if (s < 99.5 * 60)
		snprintf(buf, 16, "%.0f min", s / 60);
	else if (s < 48 * 3600)
		snprintf(buf, 16, "%.1f h", s / 3600);
	else if (s < 1e9)
		snprintf(buf, 16, "%.0f d", s / 86400);
	else
		snprintf(buf, 16, "> 1e4 d");
	return buf;
}

/* printf's widths count bytes: pad `s` (ASCII or the one "—") to `width`
 * columns, right-aligned. */
static void put_right(const char *s, int width)
{
	int cols = 0;
	for (const char *c = s; *c; c++)
		cols += ((unsigned char)*c & 0xc0) != 0x80;
	for (; cols < width; cols++)
		putchar(' ');
	fputs(s, stdout);
}

/* Print a string the server sent (a worker's group, task, comm) so that
 * it cannot drive the terminal: C0 and C1 controls (U+009B is CSI), DEL,
 * bidirectional formatting characters and bytes that are not UTF-8 show
 * as '?'. An older server passes such names through. */
/* The columns code point `c` takes on a terminal: 2 for a wide one (CJK,
 * most emoji), 0 for a combining mark, else 1. wcwidth() knows only in a
 * UTF-8 locale, whatever the user's is: the one glibc always has. */
static int cp_cols(uint32_t c)
{
	static locale_t utf8;
	static bool tried;
	if (c < 0x80)
		return 1;
	if (!tried) {
		tried = true;
		utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
	}
	if (!utf8) /* no C.UTF-8: the wide blocks, so a cut is never late */
		return (c >= 0x1100 && c <= 0x115f) ||
		               (c >= 0x2e80 && c <= 0xa4cf) ||
		               (c >= 0xac00 && c <= 0xd7a3) ||
		               (c >= 0xf900 && c <= 0xfaff) ||
		               (c >= 0xfe30 && c <= 0xfe4f) ||
		               (c >= 0xff00 && c <= 0xff60) ||
		               (c >= 0xffe0 && c <= 0xffe6) ||
		               (c >= 0x1f300 && c <= 0x1f64f) ||
		               (c >= 0x1f900 && c <= 0x1f9ff) ||
		               (c >= 0x20000 && c <= 0x3fffd)
		           ? 2
		           : 1;
	locale_t was = uselocale(utf8);
	int w = wcwidth((wchar_t)c);
	uselocale(was);
	return w < 0 ? 1 : w;
}

/* What put_clean prints of the character at `u`: its length (0: not
 * UTF-8, printed as '?') and its columns. */
static size_t clean_char(const unsigned char *u, int *cols)
{
	uint32_t c = 0;
	size_t k = mt_utf8_seq(u, &c);
	if (k == 0 || mt_cp_hostile(c)) {
		*cols = 1;
		return 0;
	}
	*cols = cp_cols(c);
	return k;
}

static void put_clean(const char *s, int width)
{
	int n = 0;
	const unsigned char *u = (const unsigned char *)s;
	while (*u) {
		int w;
		size_t k = clean_char(u, &w);
		if (k == 0)
			putchar('?');
		else
			fwrite(u, 1, k, stdout);
		u += k ? k : 1;
		n += w;
	}
	for (; n < width; n++)
		putchar(' ');
}

/* Widen a column to fit `s` as put_clean prints it, up to 64 columns: a
 * longer name only pushes its own row out of line rather than every
 * row. */
static int max_width(int w, const char *s)
{
	int n = 0;
	for (const unsigned char *u = (const unsigned char *)s; *u;) {
		int c;
		size_t k = clean_char(u, &c);
		u += k ? k : 1;
		n += c;
	}
	return n > w ? (n > 64 ? 64 : n) : w;
}

/* The server withholds another user's names (its show_others) and says
 * so with an empty group: every registered process has one. */
static bool names_withheld(const struct memtally_process *p)
{
	return !p->group || !p->group[0];
}

/* A name for the table, or "-" where the server withheld it. */
static const char *shown(const struct memtally_process *p, const char *name)
{
	return names_withheld(p) || !name || !name[0] ? "-" : name;
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
		gw = max_width(gw, shown(&p[i], p[i].group));
		fw = max_width(fw, process_flags(&p[i]));
	}
	printf("%7s  ", "PID");
	put_clean("GROUP", gw);
	printf("  %10s  %10s  %10s  %10s  %10s  %10s  %10s  %-5s  %8s  %7s  ",
	       "BYTES", "MAPPED", "ALLOC FREE", "UNVOUCHED", "RSS", "PEAK",
	       "LIMIT", "STATE", "TO LIMIT", "THREADS");
	put_clean("FLAGS", fw);
	printf("  COMM\n");
	for (size_t i = 0; i < n; i++) {
		char b[16], m[16], af[16], uv[16], r[16], pk[16], l[16],
		    eta[16];
		printf("%7" PRIu32 "  ", p[i].pid);
		put_clean(shown(&p[i], p[i].group), gw);
		printf("  %10s  %10s  %10s  %10s  %10s  %10s  %10s  %-5s  ",
		       fmt_size(b, p[i].bytes), fmt_size(m, p[i].mapped),
		       fmt_size(af, p[i].allocator_free),
		       fmt_size(uv, p[i].unvouched), fmt_size(r, p[i].rss),
		       fmt_size(pk, p[i].peak), fmt_limit(l, p[i].limit),
		       memtally_state_name(p[i].state));
		put_right(fmt_eta(eta, p[i].seconds_to_limit), 8);
		printf("  %7" PRIu32 "  ", p[i].threads);
		put_clean(process_flags(&p[i]), fw);
		printf("  ");
		put_clean(shown(&p[i], p[i].comm), 0);
		putchar('\n');
	}
}

static json_int_t jint(uint64_t v);
static json_t *jstr(const char *s);

/* ---- fields this command does not know ---------------------------- */

/*
 * The Usage and GroupUsage fields `status` shows by hand, by name (ticks,
 * threshold and the slots only in --json). Every other field a server
 * sends is shown through its protobuf-c descriptor, named as the field
 * is: a line under the fleet's, a column of the groups' table, a key in
 * --json. So a figure added to memtally.proto reaches `status` with no
 * change here.
 */
static const char *const usage_by_hand[] = {"fleet_bytes",
                                            "fleet_peak",
                                            "fleet_limit",
                                            "reserved_bytes",
                                            "state",
                                            "processes",
                                            "groups",
                                            "group",
                                            "process",
                                            "error_bytes",
                                            "unregistered",
                                            "ticks",
                                            "threshold",
                                            "slots",
                                            "slots_free",
                                            "rss_bytes",
                                            "measure",
                                            "reservations",
                                            "process_limit",
                                            "high_watermark_bytes",
                                            "growth_bytes_per_s",
                                            "seconds_to_limit",
                                            "growth_window_ms",
                                            "forecast_horizon_ms",
                                            "mapped_bytes",
                                            "allocator_free_bytes",
                                            "unvouched_bytes",
                                            "node_bytes",
                                            "node_line",
                                            "node_limit",
                                            "node_source",
                                            "node_edge",
                                            NULL};
static const char *const group_by_hand[] = {"name",
                                            "bytes",
                                            "peak",
                                            "limit",
                                            "state",
                                            "processes",
                                            "reserved_bytes",
                                            "error_bytes",
                                            "rss_bytes",
                                            "reservations",
                                            "high_watermark_bytes",
                                            "growth_bytes_per_s",
                                            "seconds_to_limit",
                                            "mapped_bytes",
                                            "allocator_free_bytes",
                                            "unvouched_bytes",
                                            NULL};

/* Field `k` of `m` when it is to be shown generically: a single value
 * (not a message, not repeated) that is not shown by hand; else NULL. */
static const ProtobufCFieldDescriptor *
extra_field(const ProtobufCMessage *m, const char *const *by_hand, unsigned k)
{
	const ProtobufCFieldDescriptor *f = &m->descriptor->fields[k];
	if (f->label == PROTOBUF_C_LABEL_REPEATED ||
	    f->type == PROTOBUF_C_TYPE_MESSAGE ||
	    f->type == PROTOBUF_C_TYPE_BYTES)
		return NULL;
	for (const char *const *n = by_hand; *n; n++)
		if (strcmp(*n, f->name) == 0)
			return NULL;
	return f;
}

static unsigned n_fields(const ProtobufCMessage *m)
{
	return m ? m->descriptor->n_fields : 0;
}

/* A field's value, by its type. */
struct field_value {
	enum { FV_UINT, FV_INT, FV_REAL, FV_BOOL, FV_STR, FV_NONE } kind;
	uint64_t u;
	int64_t i;
	double d;
	const char *s; /* FV_STR, and an enum's name */
};

static struct field_value field_value(const ProtobufCMessage *m,
                                      const ProtobufCFieldDescriptor *f)
{
	const char *at = (const char *)m + f->offset;
	const char *q = (const char *)m + f->quantifier_offset;
	struct field_value v = {.kind = FV_NONE};
	if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
	        ? *(const uint32_t *)q != f->id
	        : f->label == PROTOBUF_C_LABEL_OPTIONAL &&
	              !*(const protobuf_c_boolean *)q)
		return v; /* not set */
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		return (struct field_value){.kind = FV_INT,
		                            .i = *(const int32_t *)at};
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		return (struct field_value){.kind = FV_INT,
		                            .i = *(const int64_t *)at};
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		return (struct field_value){.kind = FV_UINT,
		                            .u = *(const uint32_t *)at};
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		return (struct field_value){.kind = FV_UINT,
		                            .u = *(const uint64_t *)at};
	case PROTOBUF_C_TYPE_FLOAT:
		return (struct field_value){.kind = FV_REAL,
		                            .d = *(const float *)at};
	case PROTOBUF_C_TYPE_DOUBLE:
		return (struct field_value){.kind = FV_REAL,
		                            .d = *(const double *)at};
	case PROTOBUF_C_TYPE_BOOL:
		return (struct field_value){
		    .kind = FV_BOOL, .u = *(const protobuf_c_boolean *)at};
	case PROTOBUF_C_TYPE_ENUM: {
		int e = *(const int *)at;
		const ProtobufCEnumValue *ev =
		    protobuf_c_enum_descriptor_get_value(f->descriptor, e);
		if (ev)
			return (struct field_value){.kind = FV_STR,
			                            .s = ev->name};
		return (struct field_value){.kind = FV_INT, .i = e};
	}
	case PROTOBUF_C_TYPE_STRING: {
		const char *str = *(const char *const *)at;
		return (struct field_value){.kind = FV_STR,
		                            .s = str ? str : ""};
	}
	default:
		return v;
	}
}

static bool ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), t = strlen(tail);
	return n >= t && strcmp(s + n - t, tail) == 0;
}

/* The value for people: a size for a *_bytes field. */
static const char *fmt_field(char buf[static 32], const ProtobufCMessage *m,
                             const ProtobufCFieldDescriptor *f)
{
	struct field_value v = field_value(m, f);
	switch (v.kind) {
	case FV_UINT:
		if (ends_with(f->name, "_bytes"))
			return fmt_size(buf, v.u);
		snprintf(buf, 32, "%" PRIu64, v.u);
		return buf;
	case FV_INT:
		snprintf(buf, 32, "%" PRId64, v.i);
		return buf;
	case FV_REAL:
		snprintf(buf, 32, "%g", v.d);
		return buf;
	case FV_BOOL:
		return v.u ? "yes" : "no";
	case FV_STR:
		return v.s;
	case FV_NONE:
		break;
	}
	return "-";
}

/* A field's name for people: "test_dummy_bytes" is "test dummy" (a
 * column's header in capitals). */
static const char *field_label(char buf[static 64], const char *name,
                               bool upper)
{
	size_t n = strlen(name);
	if (ends_with(name, "_bytes"))
		n -= 6;
	if (n > 63)
		n = 63;
	for (size_t i = 0; i < n; i++)
		buf[i] = name[i] == '_' ? ' '
		         : upper        ? (char)toupper((unsigned char)name[i])
		                        : name[i];
	buf[n] = '\0';
	return buf;
}

/* The fleet's fields not shown by hand, a line each; how many. */
static size_t print_usage_extras(const ProtobufCMessage *m)
{
	size_t lines = 0;
	for (unsigned k = 0; k < n_fields(m); k++) {
		const ProtobufCFieldDescriptor *f =
		    extra_field(m, usage_by_hand, k);
		if (!f)
			continue;
		char label[64], v[32];
		printf("%-11s ", field_label(label, f->name, false));
		put_clean(fmt_field(v, m, f), 0);
		putchar('\n');
		lines++;
	}
	return lines;
}

/* The groups' fields not shown by hand: the headers of their columns,
 * or group `g`'s values (m: its GroupUsage, or any for the headers). */
static void print_group_extras(const ProtobufCMessage *m, bool header)
{
	for (unsigned k = 0; k < n_fields(m); k++) {
		const ProtobufCFieldDescriptor *f =
		    extra_field(m, group_by_hand, k);
		if (!f)
			continue;
		char buf[64];
		printf("  ");
		if (header)
			put_right(field_label(buf, f->name, true), 10);
		else
			put_right(fmt_field(buf, m, f), 10);
	}
}

/* The fields of `m` not shown by hand, added to the JSON object `o` under
 * their names. */
static void json_extras(json_t *o, const ProtobufCMessage *m,
                        const char *const *by_hand)
{
	for (unsigned k = 0; o && k < n_fields(m); k++) {
		const ProtobufCFieldDescriptor *f = extra_field(m, by_hand, k);
		if (!f)
			continue;
		struct field_value v = field_value(m, f);
		json_t *j = NULL;
		switch (v.kind) {
		case FV_UINT:
			j = json_integer(jint(v.u));
			break;
		case FV_INT:
			j = json_integer(v.i);
			break;
		case FV_REAL:
			j = isfinite(v.d) ? json_real(v.d) : json_null();
			break;
		case FV_BOOL:
			j = json_boolean(v.u);
			break;
		case FV_STR:
			j = jstr(v.s);
			break;
		case FV_NONE:
			j = json_null();
			break;
		}
		json_object_set_new(o, f->name, j);
	}
}

/* The GroupUsage of group i, or NULL. */
static const ProtobufCMessage *group_msg(const Memtally__V1__Usage *raw,
                                         size_t i)
{
	return raw && i < raw->n_groups ? &raw->groups[i]->base : NULL;
}

static void print_groups(const struct memtally_usage *u,
                         const Memtally__V1__Usage *raw)
{
	int gw = 5; /* strlen("GROUP") */
	for (size_t i = 0; i < u->n_groups; i++)
		gw = max_width(gw, u->groups[i].name);
	put_clean("GROUP", gw);
	printf("  %10s  %10s  %10s  %10s  %10s  %10s  %10s  %-5s  %12s  %8s  "
	       "%5s",
	       "BYTES", "MAPPED", "ALLOC FREE", "RSS", "PEAK", "LIMIT",
	       "RESERVED", "STATE", "GROWTH", "TO LIMIT", "PROCS");
	print_group_extras(group_msg(raw, 0), true);
	putchar('\n');
	for (size_t i = 0; i < u->n_groups; i++) {
		const struct memtally_group_usage *g = &u->groups[i];
		char b[16], m[16], af[16], r[16], pk[16], l[16], rs[16], gr[24],
		    eta[16];
		put_clean(g->name, gw);
		printf(
		    "  %10s  %10s  %10s  %10s  %10s  %10s  %10s  %-5s  %12s  ",
		    fmt_size(b, g->bytes), fmt_size(m, g->mapped),
		    fmt_size(af, g->allocator_free), fmt_size(r, g->rss),
		    fmt_size(pk, g->peak), fmt_limit(l, g->limit),
		    fmt_size(rs, g->reserved), memtally_state_name(g->state),
		    fmt_rate(gr, g->growth));
		put_right(fmt_eta(eta, g->seconds_to_limit), 8);
		printf("  %5" PRIu32, g->processes);
		print_group_extras(group_msg(raw, i), false);
		putchar('\n');
	}
}

/* The node as memtallyd's guard reads it (the kernel's figure, beside the
 * counted fleet above), when the guard is on. */
static void print_node(const Memtally__V1__Usage *raw)
{
	char b[16], ln[16], lim[16];
	if (!raw || !raw->node_limit)
		return;
	bool commit = raw->node_edge && strcmp(raw->node_edge, "commit") == 0;
	char src[64];
	printf("node        %s  (%s, %s; guard's line %s of %s %s)\n",
	       fmt_size(b, raw->node_bytes),
	       commit ? "committed: Committed_AS, overcommit strict"
	              : "the kernel's figure",
	       mtcli_clean(src, sizeof(src), raw->node_source),
	       fmt_size(ln, raw->node_line), commit ? "CommitLimit" : "limit",
	       fmt_size(lim, raw->node_limit));
}

/* `raw`: the message `u` was made from (NULL: only what `u` holds).
 * Returns the lines printed before the groups' table. */
static size_t print_status(const struct memtally_usage *u,
                           const Memtally__V1__Usage *raw,
                           const struct memtally_process *p, size_t n)
{
	char b[16], e[16], pk[16], l[16], r[16], rss[16], pl[16], hw[16],
	    mp[16], af[16], uv[16];
	printf("fleet       %s ± %s  (peak %s)\n", fmt_size(b, u->bytes),
	       fmt_size(e, u->error_bytes), fmt_size(pk, u->peak));
	printf("mapped      %s  (of which: memory the workers mapped "
	       "themselves)\n",
	       fmt_size(mp, u->mapped));
	printf("alloc free  %s  (of which: memory the workers' allocators keep "
	       "free for them)\n",
	       fmt_size(af, u->allocator_free));
	if (u->unvouched)
		printf("unvouched   %s  (claimed by workers of untrusted users "
		       "beyond what the kernel vouches for: not counted)\n",
		       fmt_size(uv, u->unvouched));
	printf("rss         %s\n", fmt_size(rss, u->rss));
	print_node(raw);
	printf("limit       %s", fmt_limit(l, u->limit));
	char ms[64];
	mtcli_clean(ms, sizeof(ms), u->measure);
	if (u->limit && u->high_watermark)
		printf("  (high from %s%s%s)", fmt_size(hw, u->high_watermark),
		       ms[0] ? ", measure " : "", ms);
	else if (ms[0])
		printf("  (measure %s)", ms);
	putchar('\n');
	if (u->process_limit)
		printf("per process %s\n", fmt_size(pl, u->process_limit));
	printf("reserved    %s", fmt_size(r, u->reserved));
	if (u->reservations)
		printf("  (%" PRIu32 " reservation%s)", u->reservations,
		       u->reservations == 1 ? "" : "s");
	putchar('\n');
	printf("state       %s\n", memtally_state_name(u->state));
	char gr[24], eta[16];
	printf("growth      %s", fmt_rate(gr, u->growth));
	if (u->growth_window_ms)
		printf("  (over %g s)", u->growth_window_ms / 1000.0);
	putchar('\n');
	printf("to limit    %s", fmt_eta(eta, u->seconds_to_limit));
	if (u->forecast_horizon_ms)
		printf("  (high when under %g s)",
		       u->forecast_horizon_ms / 1000.0);
	putchar('\n');
	printf("processes   %" PRIu32, u->processes);
	if (u->unregistered)
		printf(" (+%" PRIu32 " unregistered: no free slot)",
		       u->unregistered);
	putchar('\n');
	size_t extras = print_usage_extras(raw ? &raw->base : NULL);
	if (u->n_groups) {
		putchar('\n');
		print_groups(u, raw);
	}
	if (n) {
		printf("\ntop processes\n");
		print_processes(p, n, STATUS_TOP_PROCESSES);
	}
	return extras;
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

static json_t *jstr(const char *s);

/* A rate as a JSON number. */
static json_t *jrate(double v)
{
	return json_real(isfinite(v) ? v : 0);
}

/* Seconds to the limit, or null for no forecast. */
static json_t *jforecast(double v)
{
	return v > 0 && isfinite(v) ? json_real(v) : json_null();
}

/* A number the server sent: null when it is not one (NaN, infinite),
 * which json_pack would refuse, failing the whole document. */
static json_t *jnum(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

/* The horizon (or window) in seconds, null when off. */
static json_t *jms(uint32_t ms)
{
	return ms ? json_real(ms / 1000.0) : json_null();
}

/* A string, or null for "" (a name that is not there). */
static json_t *jopt(const char *s)
{
	return s && s[0] ? jstr(s) : json_null();
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

/* The node object of --json: null when the guard is off. */
static json_t *json_node(const Memtally__V1__Usage *raw)
{
	if (!raw || !raw->node_limit)
		return json_null();
	return json_pack("{s:I, s:I, s:I, s:o, s:o}", "bytes",
	                 jint(raw->node_bytes), "line", jint(raw->node_line),
	                 "limit", jint(raw->node_limit), "source",
	                 jopt(raw->node_source ? raw->node_source : ""), "edge",
	                 jopt(raw->node_edge ? raw->node_edge : ""));
}

/*
 * The documents below are the `--json` shapes docs/OPERATIONS.md
 * documents; a field may be added, never renamed. One key per line so the
 * shape reads as JSON.
 */
static json_t *json_status(const struct memtally_usage *u,
                           const Memtally__V1__Usage *raw)
{
	json_t *groups = json_array();
	if (!groups)
		return NULL;
	for (size_t i = 0; i < u->n_groups; i++) {
		const struct memtally_group_usage *g = &u->groups[i];
		/* clang-format off */
		json_t *jg = json_pack(
			"{s:o, s:I, s:I, s:o, s:s, s:I, s:I, s:I, s:I, s:I,"
			" s:o, s:o, s:o, s:I, s:I, s:I}",
			"name", jstr(g->name),
			"bytes", jint(g->bytes),
			"peak", jint(g->peak),
			"limit", jlimit(g->limit),
			"state", memtally_state_name(g->state),
			"processes", (json_int_t)g->processes,
			"reserved", jint(g->reserved),
			"error_bytes", jint(g->error_bytes),
			"rss", jint(g->rss),
			"reservations", (json_int_t)g->reservations,
			"high_watermark", jlimit(g->high_watermark),
			"growth_bytes_per_s", jrate(g->growth),
			"seconds_to_limit", jforecast(g->seconds_to_limit),
			"mapped", jint(g->mapped),
			"allocator_free", jint(g->allocator_free),
			"unvouched", jint(g->unvouched));
		/* clang-format on */
		json_extras(jg, group_msg(raw, i), group_by_hand);
		if (json_array_append_new(groups, jg) < 0)
			goto fail_put_groups;
	}
	/* clang-format off */
	json_t *doc = json_pack("{s:{s:I, s:I, s:o, s:I, s:s, s:I, s:I, s:I, s:o, "
			 "s:o, s:o, s:o, s:I, s:I, s:I}, s:o, s:I, s:I, s:o, s:I, s:I, s:I, "
			 "s:I, s:o, s:o}",
		"fleet",
			"bytes", jint(u->bytes),
			"peak", jint(u->peak),
			"limit", jlimit(u->limit),
			"reserved", jint(u->reserved),
			"state", memtally_state_name(u->state),
			"error_bytes", jint(u->error_bytes),
			"rss", jint(u->rss),
			"reservations", (json_int_t)u->reservations,
			"measure", jopt(u->measure),
			"high_watermark", jlimit(u->high_watermark),
			"growth_bytes_per_s", jrate(u->growth),
			"seconds_to_limit", jforecast(u->seconds_to_limit),
			"mapped", jint(u->mapped),
			"allocator_free", jint(u->allocator_free),
			"unvouched", jint(u->unvouched),
		"process_limit", jlimit(u->process_limit),
		"processes", (json_int_t)u->processes,
		"unregistered", (json_int_t)u->unregistered,
		"groups", groups,
		"ticks", jint(u->ticks),
		"threshold", jint(u->threshold),
		"slots", (json_int_t)u->slots,
		"slots_free", (json_int_t)u->slots_free,
		"growth_window_s", jms(u->growth_window_ms),
		"forecast_horizon_s", jms(u->forecast_horizon_ms));
	/* clang-format on */
	json_extras(json_object_get(doc, "fleet"), raw ? &raw->base : NULL,
	            usage_by_hand);
	if (doc)
		json_object_set_new(doc, "node", json_node(raw));
	return doc;

fail_put_groups:
	json_decref(groups);
	return NULL;
}

/* Why its claims count as they do (memtally_process.trust); null from a
 * server that does not say. */
static json_t *jtrust(uint32_t trust)
{
	static const char *const names[] = {
	    [MEMTALLY_TRUST_FULL] = "full",
	    [MEMTALLY_TRUST_UID] = "untrusted uid",
	    [MEMTALLY_TRUST_LEFT] = "left its uid",
	    [MEMTALLY_TRUST_IN_REACH] =
	        "in reach of a worker that left its uid",
	    [MEMTALLY_TRUST_SLOT_UNREADABLE] = "slot unreadable",
	    [MEMTALLY_TRUST_EXEC_UNREGISTERED] =
	        "exec'd an image that has not registered",
	};
	return trust && trust < sizeof(names) / sizeof(names[0])
	           ? json_string(names[trust])
	           : json_null();
}

/* One process, as in `ps --json` and the `top` of a denial. Names the
 * server withheld are null, and `names_withheld` says why. */
static json_t *json_process(const struct memtally_process *p)
{
	bool hidden = names_withheld(p);
	bool by_uid = p->trust == MEMTALLY_TRUST_LEFT ||
	              p->trust == MEMTALLY_TRUST_IN_REACH;
	/* clang-format off */
	return json_pack(
		"{s:I, s:o, s:I, s:I, s:o, s:b, s:I, s:o, s:b, s:I, s:I, s:I,"
		" s:s, s:o, s:o, s:o, s:I, s:I, s:I, s:o, s:o, s:I, s:b}",
		"pid", (json_int_t)p->pid,
		"group", hidden ? json_null() : jstr(p->group),
		"bytes", jint(p->bytes),
		"peak", jint(p->peak),
		"limit", jlimit(p->limit),
		"over_limit", (int)p->over_limit,
		"threads", (json_int_t)p->threads,
		"comm", hidden ? json_null() : jstr(p->comm),
		"corrupt", (int)p->corrupt,
		"uid", (json_int_t)p->uid,
		"error_bytes", jint(p->error_bytes),
		"rss", jint(p->rss),
		"state", memtally_state_name(p->state),
		"task", jopt(p->task),
		"growth_bytes_per_s", jrate(p->growth),
		"seconds_to_limit", jforecast(p->seconds_to_limit),
		"mapped", jint(p->mapped),
		"allocator_free", jint(p->allocator_free),
		"unvouched", jint(p->unvouched),
		"trust", jtrust(p->trust),
		"trust_uid", by_uid ? json_integer(p->trust_uid) : json_null(),
		"descendant_bytes", jint(p->descendant_bytes),
		"names_withheld", (int)hidden);
	/* clang-format on */
}

/* A JSON array of processes (an empty one for n == 0). */
static json_t *json_process_list(const struct memtally_process *p, size_t n)
{
	json_t *list = json_array();
	if (!list)
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (json_array_append_new(list, json_process(&p[i])) < 0)
			goto fail_put_list;
	return list;

fail_put_list:
	json_decref(list);
	return NULL;
}

static json_t *json_processes(const struct memtally_process *p, size_t n)
{
	return json_pack("{s:o}", "processes", json_process_list(p, n));
}

/* Print `doc` (a new reference, consumed; NULL after a failed build). */
static int print_json_as(json_t *doc, size_t flags)
{
	if (!doc) {
		fprintf(stderr, "memtally: cannot build the JSON document: "
		                "out of memory\n");
		return EXIT_SERVER;
	}
	int rc = json_dumpf(doc, stdout, flags);
	json_decref(doc);
	if (rc < 0 || putchar('\n') == EOF) {
		fprintf(stderr, "memtally: cannot write to stdout: %s\n",
		        strerror(errno));
		return EXIT_SERVER;
	}
	return 0;
}

static int print_json(json_t *doc)
{
	return print_json_as(doc, JSON_INDENT(2));
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
	Memtally__V1__Response *msg = NULL;
	struct memtally_process *p = NULL;
	size_t n = 0;
	int rc = 0;
	int err = memtally_query_usage_msg(c->q, &u, &msg);
	if (err)
		return query_error(c, "get usage", err);
	if (c->json) {
		rc = print_json(json_status(u, msg->usage));
		goto out_free_usage;
	}
	err = memtally_query_processes(c->q, NULL, &p, &n);
	if (err) {
		rc = query_error(c, "list processes", err);
		goto out_free_usage;
	}
	sort_processes(p, n);
	print_status(u, msg->usage, p, n);
	memtally_processes_free(p);

out_free_usage:
	memtally__v1__response__free_unpacked(msg, NULL);
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

/*
 * A size operand or option value: memtally_parse_size()'s rules, or with
 * `allow_none`, "none" for 0. Prints the usage error itself.
 */
static int parse_size_arg(const char *what, const char *s, bool allow_none,
                          uint64_t *out)
{
	if (allow_none && strcmp(s, "none") == 0) {
		*out = 0;
		return 0;
	}
	int err = memtally_parse_size(s, out);
	/* Past 2^63 - 1 no count is real, and JSON (jansson's integers)
	 * could not say it back: refused as too large. */
	if (err == -ERANGE || (!err && *out > (uint64_t)INT64_MAX))
		return usage_error("%s '%s' is too large", what, s);
	if (err == -EDOM)
		return usage_error("%s '%s' is less than a byte (0 is written "
		                   "0%s)",
		                   what, s, allow_none ? " or none" : "");
	if (err)
		return usage_error(
		    "invalid %s '%s': expected bytes or a number "
		    "with a unit, like 512MiB, 1.5G or 64KiB%s",
		    what, s, allow_none ? ", or none" : "");
	return 0;
}

/* ---- admit --------------------------------------------------------- */

/* The forecast of the scope that decided (the fleet when granted). */
static void print_admit_forecast(const struct memtally_admit_result *a)
{
	char gr[24], eta[16];
	printf("  forecast    ");
	put_clean(a->limit_scope[0] ? a->limit_scope : "fleet", 0);
	printf(" growing %s, limit in %s\n", fmt_rate(gr, a->growth),
	       fmt_eta(eta, a->seconds_to_limit));
}

static void print_admitted(const struct cli *c,
                           const struct memtally_admit_result *a)
{
	char b[16];
	char id[80];
	printf("admitted: %s (%s", mtcli_clean(id, sizeof(id), a->reservation),
	       fmt_size(b, a->requested_bytes));
	if (c->group && c->group[0]) {
		printf(", group ");
		put_clean(c->group, 0);
	}
	if (c->task && c->task[0]) {
		printf(", task ");
		put_clean(c->task, 0);
	}
	if (a->ttl_seconds)
		printf(", ttl %" PRIu32 " s", a->ttl_seconds);
	printf(")\n");
	if (a->sized_by[0] && strcmp(a->sized_by, "declared") != 0) {
		printf("  sized by    ");
		put_clean(a->sized_by, 0);
		putchar('\n');
	}
	print_admit_forecast(a);
}

static void print_denied(const struct memtally_admit_result *a)
{
	char b[16];
	printf("denied: ");
	put_clean(a->reason[0] ? a->reason : "(no reason given)", 0);
	printf("\n  limit       %s", fmt_limit(b, a->limit));
	if (a->limit_scope[0]) {
		printf(" (");
		put_clean(a->limit_scope, 0);
		char ms[64];
		if (a->measure[0])
			printf(", %s", mtcli_clean(ms, sizeof(ms), a->measure));
		putchar(')');
	}
	printf("\n  measured    %s\n", fmt_size(b, a->fleet_bytes));
	printf("  reserved    %s\n", fmt_size(b, a->reserved_bytes));
	printf("  requested   %s\n", fmt_size(b, a->requested_bytes));
	print_admit_forecast(a);
	if (a->n_top) {
		printf("\ntop processes\n");
		print_processes(a->top, a->n_top, SIZE_MAX);
	}
}

/* The documented shapes: {"admitted": true, "reservation": S, ...} or
 * {"admitted": false, "reason": S, "fleet_bytes": N, "reserved": N,
 * "limit": N, ...}. */
static json_t *json_admit(const struct cli *c, uint32_t ttl,
                          const struct memtally_admit_result *a)
{
	json_t *doc;
	/* clang-format off */
	if (a->admitted)
		doc = json_pack("{s:b, s:s, s:o, s:o, s:I}",
			"admitted", 1,
			"reservation", a->reservation,
			"group", jopt(c->group),
			"task", jopt(c->task),
			"ttl", (json_int_t)(a->ttl_seconds ? a->ttl_seconds : ttl));
	else
		doc = json_pack("{s:b, s:o, s:o, s:o}",
			"admitted", 0,
			"reason", jstr(a->reason),
			"denied_by", jopt(a->denied_by),
			"top", json_process_list(a->top, a->n_top));
	if (!doc)
		return NULL;
	json_t *figures = json_pack(
		"{s:I, s:I, s:I, s:o, s:o, s:I, s:I, s:o, s:o, s:o, s:o, s:o}",
		"requested", jint(a->requested_bytes),
		"reserved_for_task", jint(a->reserved_for_task),
		"declared", jint(a->declared_bytes),
		"sized_by", jopt(a->sized_by),
		"kind", jopt(c->kind),
		"fleet_bytes", jint(a->fleet_bytes),
		"reserved", jint(a->reserved_bytes),
		"limit", jlimit(a->limit),
		"limit_scope", jopt(a->limit_scope),
		"measure", jopt(a->measure),
		"growth_bytes_per_s", jrate(a->growth),
		"seconds_to_limit", jforecast(a->seconds_to_limit));
	/* clang-format on */
	if (!figures || json_object_update(doc, figures) < 0) {
		json_decref(figures);
		json_decref(doc);
		return NULL;
	}
	json_decref(figures);
	return doc;
}

/* A decimal number in [1, UINT32_MAX]: no sign, no spaces. */
static bool parse_u32(const char *s, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || s[0] < '0' || s[0] > '9' || v == 0 ||
	    v > UINT32_MAX)
		return false;
	*out = (uint32_t)v;
	return true;
}

/* A worker keeps 63 bytes of MEMTALLY_TASK: a longer task name would
 * never match its reservation, nor the guard's events for it. */
#define RUN_TASK_MAX 63

/* The id of a reservation, as memtallyd makes them: "r-" and 16 hex
 * digits. */
static bool reservation_id_ok(const char *id)
{
	if (strncmp(id, "r-", 2) != 0 || strlen(id) != 18)
		return false;
	return strspn(id + 2, "0123456789abcdef") == 16;
}

/* --group, --task and --kind: names memtallyd takes, or a usage error of
 * `cmd` naming the flag. */
static int names_ok(const struct cli *c, const char *cmd)
{
	const char *names[] = {c->group, c->task, c->kind};
	const char *flags[] = {"group", "task", "kind"};
	for (int i = 0; i < 3; i++)
		if (names[i] && !mt_name_ok(names[i]))
			return usage_error("%s: --%s is not a name memtallyd "
			                   "takes (at most %u bytes of UTF-8, "
			                   "no control or bidi characters)",
			                   cmd, flags[i], MT_NAME_MAX);
	return 0;
}

/* A group its workers can carry: a worker keeps 63 bytes of
 * MEMTALLY_GROUP (and memtally_set_group() takes no more). Longer, its
 * workers were counted in a group cut short (outside the group's limit),
 * or, cut inside a character, refused registration and not counted. */
#define RUN_GROUP_MAX 63
static int group_kept(const struct cli *c, const char *cmd)
{
	if (c->group && strlen(c->group) > RUN_GROUP_MAX)
		return usage_error("%s: the group is %zu bytes, at most %d "
		                   "(what a worker keeps of MEMTALLY_GROUP)",
		                   cmd, strlen(c->group), RUN_GROUP_MAX);
	return 0;
}

static int check_admit(struct cli *c)
{
	if (!c->bytes && !c->kind)
		return usage_error("admit: --bytes SIZE or --kind K is "
		                   "required");
	if (group_kept(c, "admit"))
		return 2;
	if ((c->group && !c->group[0]) || (c->task && !c->task[0]))
		return usage_error("admit: --%s is empty",
		                   c->group && !c->group[0] ? "group" : "task");
	/* Granted, such a reservation would never be taken over by the
	 * task's workers: counted besides them until its TTL. */
	if (c->task && strlen(c->task) > RUN_TASK_MAX)
		return usage_error("admit: --task is %zu bytes, at most %d "
		                   "(what a worker keeps of MEMTALLY_TASK)",
		                   strlen(c->task), RUN_TASK_MAX);
	if (c->kind && !c->kind[0])
		return usage_error("admit: --kind is empty");
	int rc = names_ok(c, "admit");
	if (rc)
		return rc;
	c->admit.group = c->group;
	c->admit.task = c->task;
	c->admit.kind = c->kind;
	if (c->bytes) {
		rc =
		    parse_size_arg("--bytes", c->bytes, false, &c->admit.bytes);
		if (rc)
			return rc;
		if (c->admit.bytes == 0)
			return usage_error(
			    "admit: --bytes must be more than 0");
	}
	if (c->ttl && !parse_u32(c->ttl, &c->admit.ttl_seconds))
		return usage_error("invalid --ttl '%s': expected seconds from "
		                   "1 to %u",
		                   c->ttl, UINT32_MAX);
	return 0;
}

static int cmd_admit(struct cli *c)
{
	struct memtally_admit_result *a;
	int err = memtally_query_admit(c->q, &c->admit, &a);
	if (err)
		return query_error(c, "ask for admission", err);
	int rc = 0;
	if (c->json)
		rc = print_json(json_admit(c, c->admit.ttl_seconds, a));
	else if (a->admitted)
		print_admitted(c, a);
	else
		print_denied(a);
	if (rc == 0 && !a->admitted)
		rc = EXIT_DENIED;
	memtally_admit_result_free(a);
	return rc;
}

/* ---- release ------------------------------------------------------- */

static int check_release(struct cli *c)
{
	if (!c->args[0][0])
		return usage_error("release: the reservation id is empty");
	return 0;
}

static int cmd_release(struct cli *c)
{
	const char *id = c->args[0];
	uint64_t bytes;
	int err = memtally_query_release(c->q, id, &bytes);
	if (err) {
		char what[96];
		snprintf(what, sizeof(what), "release '%.64s'", id);
		return query_error(c, what, err);
	}
	if (c->json)
		return print_json(json_pack("{s:o, s:I}", "released", jstr(id),
		                            "bytes", jint(bytes)));
	char b[16];
	printf("released: ");
	put_clean(id, 0);
	printf(" (%s)\n", fmt_size(b, bytes));
	return 0;
}

/* ---- limit set ----------------------------------------------------- */

/* ps --group G and kinds K: a name memtallyd would refuse, or none,
 * is said here with exit 2 (empty, it listed everything). */
static int check_ps(struct cli *c)
{
	if (c->group && (!c->group[0] || !mt_name_ok(c->group)))
		return usage_error("ps: --group is %s", c->group[0]
		                                            ? "not a name "
		                                              "memtallyd takes"
		                                            : "empty");
	return 0;
}

static int check_kinds(struct cli *c)
{
	if (c->nargs && (!c->args[0][0] || !mt_name_ok(c->args[0])))
		return usage_error("kinds: the kind is %s",
		                   c->args[0][0] ? "not a name memtallyd takes"
		                                 : "empty");
	return 0;
}

static int check_limit(struct cli *c)
{
	if (strcmp(c->args[0], "set") != 0)
		return usage_error("limit: unknown subcommand '%s' (expected "
		                   "'set')",
		                   c->args[0]);
	const char *kind = c->nargs > 1 ? c->args[1] : "";
	int want;
	if (strcmp(kind, "fleet") == 0) {
		c->scope = MEMTALLY_SCOPE_FLEET;
		want = 3;
	} else if (strcmp(kind, "group") == 0) {
		c->scope = MEMTALLY_SCOPE_GROUP;
		want = 4;
	} else if (strcmp(kind, "pid") == 0) {
		c->scope = MEMTALLY_SCOPE_PID;
		want = 4;
	} else {
		return usage_error("limit set: expected fleet SIZE, group NAME "
		                   "SIZE or pid PID SIZE");
	}
	if (c->nargs != want)
		return usage_error("limit set %s: expected %s", kind,
		                   want == 3 ? "SIZE"
		                   : c->scope == MEMTALLY_SCOPE_PID
		                       ? "PID SIZE"
		                       : "NAME SIZE");
	if (c->scope == MEMTALLY_SCOPE_FLEET) {
		snprintf(c->label, sizeof(c->label), "fleet");
	} else if (c->scope == MEMTALLY_SCOPE_GROUP) {
		if (!c->args[2][0])
			return usage_error("limit set group: empty name");
		if (!mt_name_ok(c->args[2]))
			return usage_error("limit set group: not a name "
			                   "memtallyd takes (at most %u bytes "
			                   "of UTF-8, no control or bidi "
			                   "characters)",
			                   MT_NAME_MAX);
		snprintf(c->label, sizeof(c->label), "group:%s", c->args[2]);
	} else {
		if (!parse_u32(c->args[2], &c->pid))
			return usage_error("limit set pid: invalid pid '%s'",
			                   c->args[2]);
		snprintf(c->label, sizeof(c->label), "pid:%" PRIu32, c->pid);
	}
	return parse_size_arg("size", c->args[want - 1], true, &c->limit);
}

static int cmd_limit(struct cli *c)
{
	const char *group =
	    c->scope == MEMTALLY_SCOPE_GROUP ? c->args[2] : NULL;
	uint64_t previous;
	/* What memtallyd says is in force now, not what was asked: a pid's
	 * none puts the default per-process limit back. */
	uint64_t now = 0;
	int err = memtally_query_set_limit2(c->q, c->scope, group, c->pid,
	                                    c->limit, &previous, &now);
	if (err) {
		char what[sizeof(c->label) + 32];
		snprintf(what, sizeof(what), "set the %s limit", c->label);
		return query_error(c, what, err);
	}
	bool dflt = c->scope == MEMTALLY_SCOPE_PID && !c->limit && now;
	if (c->json)
		return print_json(json_pack("{s:o, s:o, s:o, s:b}", "scope",
		                            jstr(c->label), "limit",
		                            jlimit(now), "previous",
		                            jlimit(previous), "default", dflt));
	char l[16], p[16];
	put_clean(c->label, 0);
	printf(" limit: %s%s (was %s)\n", fmt_limit(l, now),
	       dflt ? ", the default per-process limit" : "",
	       fmt_limit(p, previous));
	return 0;
}

/* ---- watch --------------------------------------------------------- */

/* Local wall-clock time of a CLOCK_REALTIME ns stamp, to milliseconds. */
static const char *fmt_time(char buf[static 32], uint64_t ns)
{
	time_t t = (time_t)(ns / 1000000000u);
	struct tm tm;
	if (!ns || !localtime_r(&t, &tm)) {
		snprintf(buf, 32, "-");
		return buf;
	}
	size_t n = strftime(buf, 32, "%Y-%m-%d %H:%M:%S", &tm);
	snprintf(buf + n, 32 - n, ".%03u", (unsigned)(ns / 1000000u % 1000u));
	return buf;
}

static int print_event(const struct memtally_event *ev, void *arg)
{
	struct cli *c = arg;
	c->events++;
	if (c->lost) {
		/* memtallyd sends each scope's state first: the stream is
		 * back, and what changed meanwhile is in what follows. */
		fprintf(stderr, "memtally: watching %s again\n", c->where);
		c->lost = false;
	}
	if (c->json) {
		/* clang-format off */
		json_t *doc = json_pack(
			"{s:I, s:o, s:s, s:s, s:I, s:I, s:o, s:I, s:o, s:o, s:o,"
			" s:o}",
			"time_ns", jint(ev->time_ns),
			"scope", jstr(ev->scope),
			"state", memtally_state_name(ev->state),
			"previous", memtally_state_name(ev->previous),
			"bytes", jint(ev->bytes),
			"rss", jint(ev->rss),
			"limit", jlimit(ev->limit),
			"reserved", jint(ev->reserved),
			"measure", jopt(ev->measure),
			"reason", jopt(ev->reason),
			"growth_bytes_per_s", jrate(ev->growth),
			"seconds_to_limit", jforecast(ev->seconds_to_limit));
		/* clang-format on */
		if (print_json_as(doc, JSON_COMPACT))
			return -1;
	} else {
		char t[32], b[16], l[16], r[16], rs[16];
		printf("%s  ", fmt_time(t, ev->time_ns));
		put_clean(ev->scope, 12);
		/* A server may open the stream with each scope's state as it
		 * stands: no change, so no arrow. */
		printf("  %-4s %2s %-4s  %s of %s  rss %s  reserved %s",
		       ev->previous == ev->state
		           ? "is"
		           : memtally_state_name(ev->previous),
		       ev->previous == ev->state ? "" : "->",
		       memtally_state_name(ev->state), fmt_size(b, ev->bytes),
		       fmt_limit(l, ev->limit), fmt_size(r, ev->rss),
		       fmt_size(rs, ev->reserved));
		if (ev->reason[0]) {
			printf("  (");
			put_clean(ev->reason, 0);
			putchar(')');
		}
		putchar('\n');
	}
	/* One line per event, now: a reader of the pipe acts on it. */
	if (fflush(stdout) == EOF) {
		fprintf(stderr, "memtally: cannot write to stdout: %s\n",
		        strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * A frame of `top`, drawn into memory first, then onto the terminal cut to
 * its size: a line wider than the screen would wrap (each process row is
 * 137 columns and more), and more lines than it has would scroll the
 * title away. The frame's names were cleaned (valid UTF-8, no control
 * character), so each character takes the columns wcwidth() says: a row
 * of double-width names is cut at the screen's edge, not a character
 * past it.
 */
static void put_cut(const char *buf, size_t len, unsigned rows, unsigned cols)
{
	const char *p = buf, *end = buf + len;
	/* The last row stays empty: a newline there would scroll. */
	for (unsigned r = 0; p < end && r + 1 < rows; r++) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *stop = nl ? nl : end, *q = p;
		for (unsigned c = 0; q < stop;) {
			int w;
			size_t k = clean_char((const unsigned char *)q, &w);
			if (k == 0 || k > (size_t)(stop - q))
				k = 1; /* not a name's: as it is */
			if (c + (unsigned)w > cols)
				break;
			c += (unsigned)w;
			q += k;
		}
		fwrite(p, 1, (size_t)(q - p), stdout);
		putchar('\n');
		p = nl ? nl + 1 : end;
	}
}

/*
 * Like top(1): status and the process table, largest first, redrawn in
 * place every --interval seconds (default 1) until interrupted or after
 * --iterations refreshes. On a terminal the screen is cleared before each
 * refresh and the table cut to fit; piped, refreshes simply follow.
 */
static int check_top(struct cli *c)
{
	c->interval_s = 1;
	c->iterations_n = 0;
	if (c->interval) {
		char *end;
		errno = 0;
		c->interval_s = strtod(c->interval, &end);
		if (*end || !(c->interval_s >= 0.1 && c->interval_s <= 3600))
			return usage_error("top: --interval wants seconds, "
			                   "0.1 to 3600");
	}
	if (c->iterations) {
		char *end;
		errno = 0;
		c->iterations_n = strtol(c->iterations, &end, 10);
		if (*end || errno || c->iterations_n < 1)
			return usage_error("top: --iterations wants a count");
	}
	if (c->json)
		return usage_error("top: no --json; use status --json");
	return 0;
}

static int cmd_top(struct cli *c)
{
	double interval = c->interval_s;
	long iterations = c->iterations_n;
	bool tty = isatty(STDOUT_FILENO);
	FILE *screen = stdout;
	for (long i = 0; !iterations || i < iterations; i++) {
		struct memtally_usage *u = NULL;
		Memtally__V1__Response *msg = NULL;
		struct memtally_process *p = NULL;
		size_t n = 0;
		int err = memtally_query_usage_msg(c->q, &u, &msg);
		if (err)
			return query_error(c, "get usage", err);
		err = memtally_query_processes(c->q, NULL, &p, &n);
		if (err) {
			memtally__v1__response__free_unpacked(msg, NULL);
			memtally_usage_free(u);
			return query_error(c, "list processes", err);
		}
		sort_processes(p, n);
		/* On a terminal the frame goes to memory (every printer here
		 * writes to stdout, which glibc lets us point elsewhere), then
		 * to the screen cut to fit. */
		struct winsize ws;
		bool cut = tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 &&
		           ws.ws_row && ws.ws_col;
		char *frame = NULL;
		size_t frame_len = 0;
		if (cut) {
			FILE *mem = open_memstream(&frame, &frame_len);
			if (mem)
				stdout = mem;
			else
				cut = false;
		}
		if (tty && !cut)
			fputs("\033[H\033[2J", stdout);
		time_t now = time(NULL);
		char when[32];
		strftime(when, sizeof(when), "%H:%M:%S", localtime(&now));
		printf("memtally top - %s - %s, every %gs\n\n", when, c->where,
		       interval);
		print_status(u, msg->usage, NULL, 0);
		putchar('\n');
		print_processes(p, n, SIZE_MAX);
		if (cut) {
			bool ok = fclose(stdout) == 0;
			stdout = screen;
			fputs("\033[H\033[2J", stdout);
			if (ok)
				put_cut(frame, frame_len, ws.ws_row, ws.ws_col);
			free(frame);
		} else if (!tty) {
			putchar('\n');
		}
		memtally_processes_free(p);
		memtally__v1__response__free_unpacked(msg, NULL);
		memtally_usage_free(u);
		if (fflush(stdout) == EOF)
			return EXIT_SERVER;
		if (iterations && i + 1 == iterations)
			break;
		struct timespec ts = {
		    (time_t)interval,
		    (long)((interval - (time_t)interval) * 1e9)};
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	return 0;
}

/* The stream ended the way a restart of memtallyd ends it, or the server
 * is not (yet) back. */
static bool watch_lost(int err)
{
	return err == -ECONNRESET || err == -EPIPE || err == -ECONNABORTED ||
	       err == -ECONNREFUSED || err == -ENOENT;
}

#define WATCH_RETRY_FIRST_MS 200u
#define WATCH_RETRY_MAX_MS   5000u

/* Print events until our output fails; with --reconnect, a stream lost
 * (memtallyd restarted, or stopped a while) is said once on stderr and
 * opened again, every 0.2 s doubling to 5 s, for ever, as tail -F does. */
static int cmd_watch(struct cli *c)
{
	uint32_t wait_ms = WATCH_RETRY_FIRST_MS;
	for (;;) {
		uint64_t before = c->events;
		int err = memtally_query_watch(c->q, print_event, c);
		if (!err)
			return EXIT_SERVER; /* only a failed write stops it */
		if (!c->reconnect || !watch_lost(err))
			return query_error(c, "watch", err);
		if (c->events != before)
			wait_ms = WATCH_RETRY_FIRST_MS;
		if (!c->lost)
			fprintf(stderr,
			        "memtally: the watch on %s was lost (%s); "
			        "reconnecting\n",
			        c->where, memtally_strerror(err));
		c->lost = true;
		struct timespec ts = {wait_ms / 1000u,
		                      (long)(wait_ms % 1000u) * 1000000L};
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		wait_ms = wait_ms * 2 > WATCH_RETRY_MAX_MS ? WATCH_RETRY_MAX_MS
		                                           : wait_ms * 2;
	}
}

/* ---- kinds --------------------------------------------------------- */

/* {"kinds": [{"kind": S|null, "uid": N, "runs": N, "runs_total": N,
 * "learned": N|null, "learned_by": S, "evictions": N, "outstanding": N,
 * "last_peaks": [N...], "last": [{"peak": N, "end_time_ns": N,
 * "evicted": B}...], "profile": {"length_ms": N, "bytes": [N x 8]}|null}
 * ...], "quantile": F, "margin": F, "window": N, "horizon_s": N,
 * "default_size": N}. */
static json_t *json_kinds(const struct memtally_kinds *k)
{
	json_t *list = json_array();
	if (!list)
		return NULL;
	for (size_t i = 0; i < k->n_kinds; i++) {
		const struct memtally_kind *e = &k->kinds[i];
		json_t *peaks = json_array(), *last = json_array();
		for (size_t j = 0; peaks && last && j < e->n_last; j++) {
			json_array_append_new(
			    peaks, json_integer(jint(e->last[j].peak)));
			/* clang-format off */
			json_array_append_new(last, json_pack(
				"{s:I, s:I, s:b}",
				"peak", jint(e->last[j].peak),
				"end_time_ns", jint(e->last[j].end_time_ns),
				"evicted", (int)e->last[j].evicted));
			/* clang-format on */
		}
		json_t *prof = json_null();
		uint32_t len;
		uint64_t steps[MEMTALLY_KIND_STEPS];
		if (memtally_kind_profile(k, i, &len, steps) == 0) {
			json_t *b = json_array();
			for (size_t j = 0; b && j < MEMTALLY_KIND_STEPS; j++)
				json_array_append_new(
				    b, json_integer(jint(steps[j])));
			prof = json_pack("{s:I, s:o}", "length_ms",
			                 (json_int_t)len, "bytes", b);
		}
		/* clang-format off */
		json_t *je = json_pack(
			"{s:o, s:I, s:I, s:I, s:o, s:o, s:I, s:I, s:o, s:o, s:o}",
			"kind", e->kind[0] ? jstr(e->kind) : json_null(),
			"uid", (json_int_t)e->uid,
			"runs", (json_int_t)e->runs,
			"runs_total", jint(e->runs_total),
			"learned", jlimit(e->learned),
			"learned_by", jopt(e->learned_by),
			"evictions", jint(e->evictions),
			"outstanding", (json_int_t)e->outstanding,
			"last_peaks", peaks,
			"last", last,
			"profile", prof);
		/* clang-format on */
		if (json_array_append_new(list, je) < 0) {
			json_decref(list);
			return NULL;
		}
	}
	/* clang-format off */
	return json_pack("{s:o, s:o, s:o, s:I, s:I, s:I}",
		"kinds", list,
		"quantile", jnum(k->quantile),
		"margin", jnum(k->margin),
		"window", (json_int_t)k->window,
		"horizon_s", jint(k->horizon_s),
		"default_size", jint(k->default_size));
	/* clang-format on */
}

static void print_kinds(const struct memtally_kinds *k)
{
	char b[16];
	/* The profile's column as wide as its header: its figures are
	 * that wide too ("12.5s: 100.5 MiB..200.3 MiB"). */
	printf("%-24s %10s %6s %10s %9s %-29s  %s\n", "KIND", "UID", "RUNS",
	       "LEARNED", "EVICTIONS", "PROFILE (length: first..most)",
	       "LAST PEAKS (newest first)");
	for (size_t i = 0; i < k->n_kinds; i++) {
		const struct memtally_kind *e = &k->kinds[i];
		put_clean(e->kind[0] ? e->kind : "-", 24);
		printf(" %10" PRIu32 " %6" PRIu32 " %10s %9" PRIu64 " ", e->uid,
		       e->runs, e->learned ? fmt_size(b, e->learned) : "-",
		       e->evictions);
		char pr[64] = "-", f[16], m[16];
		uint32_t len;
		uint64_t steps[MEMTALLY_KIND_STEPS], most = 0;
		if (memtally_kind_profile(k, i, &len, steps) == 0) {
			for (size_t j = 0; j < MEMTALLY_KIND_STEPS; j++)
				most = steps[j] > most ? steps[j] : most;
			snprintf(pr, sizeof(pr), "%.1fs: %s..%s", len / 1000.0,
			         fmt_size(f, steps[0]), fmt_size(m, most));
		}
		printf("%-29s ", pr);
		for (size_t j = 0; j < e->n_last && j < 4; j++)
			printf(" %s%s", fmt_size(b, e->last[j].peak),
			       e->last[j].evicted ? "!" : "");
		putchar('\n');
	}
	char q[16];
	printf("\nlearned size: p%g of the last %" PRIu32
	       " runs within %" PRIu64 " s, + %g%%; no history: %s "
	       "(! = evicted)\n",
	       k->quantile, k->window, k->horizon_s, k->margin,
	       fmt_size(q, k->default_size));
}

static int cmd_kinds(struct cli *c)
{
	struct memtally_kinds *k = NULL;
	int err = memtally_query_kinds(c->q, c->nargs ? c->args[0] : NULL, &k);
	if (err)
		return query_error(c, "list kinds", err);
	int rc = 0;
	if (c->json)
		rc = print_json(json_kinds(k));
	else
		print_kinds(k);
	memtally_kinds_free(k);
	return rc;
}

/* ---- run ----------------------------------------------------------- */

static int check_run(struct cli *c)
{
	if (!c->run_argv || !c->run_argv[0])
		return usage_error("run: no command given (memtally run "
		                   "[OPTIONS] -- CMD [ARGS...])");
	if (c->json)
		return usage_error("run: no --json (stdout is the command's)");
	if (c->bytes) {
		int rc =
		    parse_size_arg("--bytes", c->bytes, false, &c->admit.bytes);
		if (rc)
			return rc;
		if (c->admit.bytes == 0)
			return usage_error("run: --bytes must be more than 0");
	} else if ((c->wait || c->ttl) && !c->kind) {
		return usage_error("run: --%s applies to an admission: give "
		                   "--bytes or --kind",
		                   c->wait ? "wait" : "ttl");
	}
	if (c->kind && !c->kind[0])
		return usage_error("run: --kind is empty");
	if (c->ttl && !parse_u32(c->ttl, &c->admit.ttl_seconds))
		return usage_error("invalid --ttl '%s': expected seconds from "
		                   "1 to %u",
		                   c->ttl, UINT32_MAX);
	if (c->wait) {
		char *end;
		errno = 0;
		double w = strtod(c->wait, &end);
		/* At most a year: a deadline, not "for ever". */
		if (errno || end == c->wait || *end || !(w >= 0) ||
		    w > 366.0 * 86400)
			return usage_error("invalid --wait '%s': expected "
			                   "seconds, 0 to 31622400",
			                   c->wait);
		c->wait_s = w;
	}
	if (c->poll) {
		char *end;
		errno = 0;
		double v = strtod(c->poll, &end);
		if (!c->wait)
			return usage_error("run: --poll applies to --wait");
		/* At most 2 s (the retries' jitter takes it to 2.5): a
		 * waiter silent for 3 s has left memtallyd's queue, and
		 * asking every 6 s, it never kept its place. */
		if (errno || end == c->poll || *end || !(v >= 0.05) || v > 2)
			return usage_error("invalid --poll '%s': expected "
			                   "seconds, 0.05 to 2",
			                   c->poll);
		c->poll_s = v;
	}
	if (c->retry && (!parse_u32(c->retry, &c->retry_n) ||
	                 c->retry_n > MTCLI_RUN_RETRY_MAX))
		return usage_error("invalid --retry '%s': expected a count, "
		                   "1 to %u",
		                   c->retry, MTCLI_RUN_RETRY_MAX);
	if ((c->group && !c->group[0]) || (c->task && !c->task[0]))
		return usage_error("run: --%s is empty",
		                   c->group && !c->group[0] ? "group" : "task");
	if (c->task && strlen(c->task) > RUN_TASK_MAX)
		return usage_error("run: --task is %zu bytes, at most %d",
		                   strlen(c->task), RUN_TASK_MAX);
	/* Without --group, the group the environment names is the run's
	 * (its command's workers carry it), and is checked as --group is. */
	if (!c->group) {
		const char *g = getenv("MEMTALLY_GROUP");
		if (g && g[0] && (strlen(g) > RUN_GROUP_MAX || !mt_name_ok(g)))
			return usage_error("run: MEMTALLY_GROUP is not a group "
			                   "a worker can carry (at most %d "
			                   "bytes of UTF-8, no control or bidi "
			                   "characters)",
			                   RUN_GROUP_MAX);
		c->group = g && g[0] ? g : NULL;
	}
	if (group_kept(c, "run"))
		return 2;
	/* What memtallyd would refuse: said here, with exit 2, rather
	 * than taken for a server that does not answer (the command would
	 * then run unadmitted). */
	int rc = names_ok(c, "run");
	if (rc)
		return rc;
	if (c->reservation) {
		/* The reservation is taken over by the workers of the task it
		 * was made for: they must carry that task's name. */
		/* "null" (jq's word for a denial's missing id) or any
		 * other word would run the command unadmitted. */
		if (!reservation_id_ok(c->reservation))
			return usage_error("invalid --reservation '%s': "
			                   "expected the id admit printed "
			                   "(r- and 16 hex digits)",
			                   c->reservation);
		if (!c->task)
			return usage_error("run: --reservation needs --task, "
			                   "the task it was admitted for");
	}
	/* A rerun is admitted as the first run is: with neither there is
	 * nothing to ask, and the evicted command would start again at once
	 * on the node that just evicted it, the guard's first choice again. */
	if (c->retry && !c->bytes && !c->kind)
		return usage_error("run: --retry needs --bytes or --kind, "
		                   "so that a rerun is admitted");
	return 0;
}

static int cmd_run(struct cli *c)
{
	struct mtcli_run_opts o = {
	    .socket = c->socket,
	    .socket_given = c->socket_given,
	    .tcp = c->tcp,
	    .token = c->token,
	    .timeout_ms = c->timeout_ms,
	    .bytes = c->admit.bytes,
	    .group = c->group,
	    .task = c->task,
	    .kind = c->kind,
	    .ttl_s = c->admit.ttl_seconds,
	    .wait_s = c->wait_s,
	    .poll_s = c->poll_s,
	    .retry = c->retry_n,
	    .reservation = c->reservation,
	    .argv = c->run_argv,
	};
	return mtcli_run(&o);
}

static const struct command commands[] = {
    {"status", NULL, cmd_status, 0, 0, 0, false},
    {"ps", check_ps, cmd_ps, TAKES_GROUP, 0, 0, false},
    {"admit", check_admit, cmd_admit,
     TAKES_GROUP | TAKES_BYTES | TAKES_TASK | TAKES_TTL | TAKES_KIND, 0, 0,
     false},
    {"kinds", check_kinds, cmd_kinds, 0, 0, 1, false},
    {"release", check_release, cmd_release, 0, 1, 1, false},
    {"limit", check_limit, cmd_limit, 0, 1, 4, false},
    {"watch", NULL, cmd_watch, TAKES_RECONNECT, 0, 0, true},
    /* Each refresh is a call of its own, with its own deadline. */
    {"top", check_top, cmd_top, TAKES_REFRESH, 0, 0, false},
    /* Connects by itself (cli_run.c): it fails open. */
    {"run", check_run, cmd_run,
     TAKES_GROUP | TAKES_BYTES | TAKES_TASK | TAKES_TTL | TAKES_WAIT |
         TAKES_KIND | TAKES_RESERVATION,
     0, 0, false},
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
	OPT_BYTES,
	OPT_TASK,
	OPT_TTL,
	OPT_INTERVAL,
	OPT_ITERATIONS,
	OPT_TCP,
	OPT_TOKEN,
	OPT_TOKEN_FILE,
	OPT_WAIT,
	OPT_POLL,
	OPT_KIND,
	OPT_RETRY,
	OPT_RESERVATION,
	OPT_RECONNECT,
	OPT_HELP,
	OPT_VERSION,
};

static const struct option long_options[] = {
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"json", no_argument, NULL, OPT_JSON},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"group", required_argument, NULL, OPT_GROUP},
    {"bytes", required_argument, NULL, OPT_BYTES},
    {"task", required_argument, NULL, OPT_TASK},
    {"kind", required_argument, NULL, OPT_KIND},
    {"ttl", required_argument, NULL, OPT_TTL},
    {"interval", required_argument, NULL, OPT_INTERVAL},
    {"iterations", required_argument, NULL, OPT_ITERATIONS},
    {"tcp", required_argument, NULL, OPT_TCP},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
    {"wait", required_argument, NULL, OPT_WAIT},
    {"poll", required_argument, NULL, OPT_POLL},
    {"retry", required_argument, NULL, OPT_RETRY},
    {"reservation", required_argument, NULL, OPT_RESERVATION},
    {"reconnect", no_argument, NULL, OPT_RECONNECT},
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

/* An option the command does not take: name the option. */
static int check_takes(const struct command *cmd, unsigned flag,
                       const char *value, const char *option)
{
	if (value && !(cmd->takes & flag))
		return usage_error("%s: %s does not apply", cmd->name, option);
	return 0;
}

/* Collect an operand: the command, then its arguments; the first past
 * MAX_OPERANDS goes to *extra for the error message. */
static void add_operand(struct cli *c, const char **cmd_name, const char *arg,
                        const char **extra)
{
	if (!*cmd_name)
		*cmd_name = arg;
	else if (c->nargs < MAX_OPERANDS)
		c->args[c->nargs++] = arg;
	else if (!*extra)
		*extra = arg;
}

/* What the command line says besides the options stored in the cli. */
struct cmdline {
	const char *cmd_name;
	const char *extra; /* an operand past MAX_OPERANDS */
	bool help, version;
};

/* getopt over argv into `c` and `p`: 0, or the exit status of a usage
 * error (said on stderr). */
static int parse_args(struct cli *c, struct cmdline *p, int argc, char **argv)
{
	opterr = 0;
	int opt;
	while (!c->run_argv && (opt = getopt_long(argc, argv, "-:hV",
	                                          long_options, NULL)) != -1) {
		switch (opt) {
		case 1: /* an operand, in order */
			/* run: the first operand after the command starts
			 * the command line to run, which is not ours to
			 * parse ("--" before it is optional). */
			if (p->cmd_name && strcmp(p->cmd_name, "run") == 0)
				c->run_argv = &argv[optind - 1];
			else
				add_operand(c, &p->cmd_name, optarg, &p->extra);
			break;
		case OPT_SOCKET:
			if (!optarg[0])
				return usage_error("--socket needs a path");
			c->socket = optarg;
			break;
		case OPT_TCP:
			if (!optarg[0])
				return usage_error("--tcp needs HOST:PORT");
			c->tcp = optarg;
			break;
		case OPT_TOKEN:
			/* Every user can read a command line
			 * (/proc/PID/cmdline, ps): a secret has no place in
			 * it. */
			return usage_error(
			    "--token is not accepted: a command line is "
			    "readable by every user; set MEMTALLY_TOKEN in the "
			    "environment or use --token-file PATH");
		case OPT_TOKEN_FILE:
			if (!optarg[0])
				return usage_error("--token-file needs a path");
			c->token_file = optarg;
			break;
		case OPT_JSON:
			c->json = true;
			break;
		case OPT_TIMEOUT:
			if (parse_timeout(optarg, &c->timeout_ms))
				return usage_error("invalid --timeout '%s': "
				                   "expected milliseconds > 0",
				                   optarg);
			break;
		case OPT_GROUP:
			c->group = optarg;
			break;
		case OPT_BYTES:
			c->bytes = optarg;
			break;
		case OPT_TASK:
			c->task = optarg;
			break;
		case OPT_TTL:
			c->ttl = optarg;
			break;
		case OPT_INTERVAL:
			c->interval = optarg;
			break;
		case OPT_ITERATIONS:
			c->iterations = optarg;
			break;
		case OPT_WAIT:
			c->wait = optarg;
			break;
		case OPT_RETRY:
			c->retry = optarg;
			break;
		case OPT_RESERVATION:
			c->reservation = optarg;
			break;
		case OPT_RECONNECT:
			c->reconnect = "";
			break;
		case OPT_POLL:
			c->poll = optarg;
			break;
		case OPT_KIND:
			c->kind = optarg;
			break;
		case 'h':
		case OPT_HELP:
			p->help = true;
			break;
		case 'V':
		case OPT_VERSION:
			p->version = true;
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
	if (!c->run_argv && p->cmd_name && strcmp(p->cmd_name, "run") == 0 &&
	    optind < argc)
		c->run_argv = &argv[optind];
	for (; !c->run_argv && optind < argc; optind++) {
		add_operand(c, &p->cmd_name, argv[optind], &p->extra);
		/* "memtally -- run [--] CMD": the command named after the
		 * "--", what follows is run's command. */
		if (p->cmd_name == argv[optind] &&
		    strcmp(p->cmd_name, "run") == 0 && optind + 1 < argc) {
			optind++;
			if (strcmp(argv[optind], "--") == 0)
				optind++;
			if (optind < argc)
				c->run_argv = &argv[optind];
			break;
		}
	}
	return 0;
}

/* The command's operands and options against what it takes: 0, or the
 * exit status of a usage error. */
static int check_command(struct cli *c, const struct command *cmd,
                         const char *extra)
{
	int rc;
	if (extra || c->nargs > cmd->max_args)
		return usage_error("%s: unexpected argument '%s'", cmd->name,
		                   extra ? extra : c->args[cmd->max_args]);
	if (c->nargs < cmd->min_args)
		return usage_error("%s: missing argument", cmd->name);
	if ((rc = check_takes(cmd, TAKES_GROUP, c->group, "--group")) ||
	    (rc = check_takes(cmd, TAKES_BYTES, c->bytes, "--bytes")) ||
	    (rc = check_takes(cmd, TAKES_TASK, c->task, "--task")) ||
	    (rc = check_takes(cmd, TAKES_KIND, c->kind, "--kind")) ||
	    (rc = check_takes(cmd, TAKES_TTL, c->ttl, "--ttl")) ||
	    (rc = check_takes(cmd, TAKES_REFRESH, c->interval, "--interval")) ||
	    (rc = check_takes(cmd, TAKES_REFRESH, c->iterations,
	                      "--iterations")) ||
	    (rc = check_takes(cmd, TAKES_WAIT, c->wait, "--wait")) ||
	    (rc = check_takes(cmd, TAKES_WAIT, c->poll, "--poll")) ||
	    (rc = check_takes(cmd, TAKES_WAIT, c->retry, "--retry")) ||
	    (rc = check_takes(cmd, TAKES_RESERVATION, c->reservation,
	                      "--reservation")) ||
	    (rc = check_takes(cmd, TAKES_RECONNECT, c->reconnect,
	                      "--reconnect")))
		return rc;
	if (c->tcp && c->socket)
		return usage_error("--socket and --tcp exclude each other");
	/* Said here, as bad input: taken for a server that cannot be
	 * reached, `run` would run its command unadmitted. */
	char host[256];
	uint16_t port = 0;
	if (c->tcp &&
	    (mt_split_hostport(c->tcp, host, sizeof(host), &port) < 0 ||
	     !host[0] || port == 0))
		return usage_error("invalid --tcp '%s': expected HOST:PORT "
		                   "(an IPv6 address in brackets), a port of "
		                   "1 to 65535",
		                   c->tcp);
	if (c->socket &&
	    strlen(c->socket) >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return usage_error("--socket: a path of %zu bytes; a socket's "
		                   "is at most %zu",
		                   strlen(c->socket),
		                   sizeof(((struct sockaddr_un *)0)->sun_path) -
		                       1);
	if (cmd->check && (rc = cmd->check(c)))
		return rc;
	return 0;
}

/* Connect to the server as asked: 0, or EXIT_SERVER after saying why. */
static int connect_server(struct cli *c, const struct command *cmd)
{
	/* A stream waits for events as long as it takes, unless told. */
	int timeout = c->timeout_ms;
	if (cmd->streams && !timeout)
		timeout = -1;
	int err;
	if (c->tcp) {
		c->where = c->tcp;
		err = memtally_query_open_tcp(&c->q, c->tcp, timeout);
	} else {
		if (!c->socket)
			c->socket = memtally_query_default_socket();
		c->where = c->socket;
		err = memtally_query_open(&c->q, c->socket, timeout);
	}
	if (err) {
		bool down = err == -ENOENT || err == -ECONNREFUSED;
		fprintf(stderr, "memtally: cannot connect to %s: %s%s\n",
		        c->where, memtally_strerror(err),
		        down ? " (is memtallyd running?)" : "");
		return EXIT_SERVER;
	}
	if (c->token && c->token[0] &&
	    (err = memtally_query_set_token(c->q, c->token))) {
		fprintf(stderr, "memtally: %s\n", memtally_strerror(err));
		memtally_query_close(c->q);
		return EXIT_SERVER;
	}
	return 0;
}

/* The token: --token-file's first line (trailing blanks cut), else
 * $MEMTALLY_TOKEN, else none. */
static int read_token(struct cli *c)
{
	if (!c->token_file) {
		c->token = getenv("MEMTALLY_TOKEN");
		return 0;
	}
	FILE *f = fopen(c->token_file, "re");
	if (!f) {
		fprintf(stderr, "memtally: cannot read --token-file %s: %s\n",
		        c->token_file, strerror(errno));
		return EXIT_USAGE;
	}
	bool got = fgets(c->token_buf, sizeof(c->token_buf), f) != NULL;
	fclose(f);
	size_t n = got ? strcspn(c->token_buf, "\n") : 0;
	while (n > 0 &&
	       (c->token_buf[n - 1] == ' ' || c->token_buf[n - 1] == '\t' ||
	        c->token_buf[n - 1] == '\r'))
		n--;
	c->token_buf[n] = '\0';
	if (n == 0) {
		fprintf(stderr, "memtally: --token-file %s holds no token\n",
		        c->token_file);
		return EXIT_USAGE;
	}
	c->token = c->token_buf;
	return 0;
}

/* A standard descriptor closed by whoever started us would be the number
 * of the next one we open (a socket): our messages to stderr would go to
 * memtallyd. /dev/null there, close-on-exec, so that a command `run`
 * starts still finds it closed. */
static void stdio_held(void)
{
	for (int fd = 0; fd <= 2; fd++) {
		if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
			continue;
		int n = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (n >= 0 && n != fd) {
			dup3(n, fd, O_CLOEXEC);
			close(n);
		}
	}
}

int main(int argc, char **argv)
{
	stdio_held();
	struct cli c = {0};
	struct cmdline p = {0};
	int rc = parse_args(&c, &p, argc, argv);
	if (rc)
		return rc;
	if (p.help) {
		usage(stdout);
		return close_stdout(0);
	}
	if (p.version) {
		printf("memtally %s\n", MEMTALLY_VERSION_STRING);
		return close_stdout(0);
	}
	if (!p.cmd_name)
		return usage_error("no command given");
	const struct command *cmd = find_command(p.cmd_name);
	if (!cmd)
		return usage_error("unknown command '%s'", p.cmd_name);
	if ((rc = check_command(&c, cmd, p.extra)))
		return rc;
	if ((rc = read_token(&c)))
		return rc;
	if (cmd->run == cmd_run) {
		c.socket_given = c.socket != NULL;
		if (!c.tcp && !c.socket)
			c.socket = memtally_query_default_socket();
		return cmd_run(&c);
	}
	if ((rc = connect_server(&c, cmd)))
		return rc;
	rc = cmd->run(&c);
	memtally_query_close(c.q);
	return close_stdout(rc);
}
