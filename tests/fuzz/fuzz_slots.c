/*
 * fuzz_slots.c - libFuzzer target: what a worker (or anything that can map
 * the segment) can write into its slots, as memtallyd's tick and a
 * restarted memtallyd's adoption read it.
 *
 * fuzz_segment covers the header and the validator; this target keeps a
 * real, valid segment and scribbles over slot CONTENTS: identity fields
 * (pid, uid, start time, generation, flags), client counters (threads,
 * lanes_used, overflow), lanes (owner, bytes, flushes) and the per-slot
 * names of layout 1.1. Three real child processes are registered through
 * the server core's registry at start (as memtallyd registers workers);
 * slot 3 is free. Each input is applied to a fresh copy of that segment,
 * then:
 *
 *   1. mts_tick() on the registry that registered them. Checked: no crash
 *      (ASan/UBSan); the registry is authoritative: the same three pids in
 *      the same slots with the same start times whatever the slot's pid
 *      field now says, and ListProcesses (through mts_dispatch) lists
 *      exactly them; a slot whose counters are absurd is quarantined and
 *      counts 0; the fleet total is exactly the sum of the processes that
 *      are not quarantined, and equals the sum of the groups.
 *   2. when the input's first byte has bit 7 set, adoption: a second
 *      registry adopts the scribbled segment as a restarted memtallyd
 *      would (mts_adopt) and ticks. Checked: every process it adopted is
 *      alive with the start time the registry recorded (identity from the
 *      segment is only a lead, checked against /proc), at most the slot
 *      count, and the same quarantine and total invariants.
 *
 * Input: byte 0 = flags, then edits of [op][offset][len][len bytes]:
 *   op & 3        the slot
 *   (op >> 2) & 3 0: slot identity (64 bytes), 1: the slot's lines
 *                 (identity and lanes), 2: its names entry, 3: an 8-byte
 *                 "interesting" value (op >> 4 picks it) at an aligned
 *                 offset of its lines
 *
 * The segment (/mt-fuzzslots-<pid>, 4 slots x 2 lanes) and the children
 * live for the whole run; both are cleaned up at exit.
 */
#include "server.h"

#include "log.h"
#include "memtally.pb-c.h"
#include "mtframe.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NKIDS 3
#define SLOTS 4u
#define LANES 2u

static uv_loop_t loop;
static struct mts_server srv;
static char segname[64];
static int ready;
static pid_t kids[NKIDS];
static uint32_t kid_slot[NKIDS];
static uint64_t kid_start[NKIDS];
static uint8_t *snapshot; /* the whole segment as registered */
static size_t stride;     /* bytes from one slot to the next */

static void cleanup(void)
{
	if (!ready)
		return;
	ready = 0;
	for (int i = 0; i < NKIDS; i++) {
		kill(kids[i], SIGKILL);
		waitpid(kids[i], NULL, 0);
	}
	mts_server_stop(&srv);
	uv_run(&loop, UV_RUN_DEFAULT);
	mts_server_free(&srv);
	uv_loop_close(&loop);
	mtshm_unlink(segname);
	free(snapshot);
}

static void die(const char *what)
{
	fprintf(stderr, "fuzz_slots: %s\n", what);
	abort();
}

/* A child that lives until killed (reported once it runs). */
static pid_t spawn(void)
{
	int p[2];
	if (pipe(p) != 0)
		die("pipe");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		close(p[0]);
		char c = 'x';
		if (write(p[1], &c, 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	char c;
	if (read(p[0], &c, 1) != 1)
		die("child did not start");
	close(p[0]);
	return pid;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* Silence the "corrupt, excluded" warnings. */
	mts_log_set_level((enum mts_log_level)(MTS_LOG_ERROR + 1));
	snprintf(segname, sizeof(segname), "/mt-fuzzslots-%ld", (long)getpid());
	mtshm_unlink(segname);
	struct mts_config cfg = {
	    .socket_path = NULL,
	    .segment = segname,
	    .slots = SLOTS,
	    .lanes = LANES,
	    .tick_ms = 60000, /* ticked by hand */
	    .threshold = 1000,
	};
	if (uv_loop_init(&loop) != 0 || mts_server_init(&srv, &loop, &cfg) != 0)
		die("cannot start a server");
	ready = 1;
	atexit(cleanup);
	static const char *const groups[NKIDS] = {"batch", "web", ""};
	for (int i = 0; i < NKIDS; i++) {
		kids[i] = spawn();
		struct mts_peer peer = {.fd = -1,
		                        .has_cred = true,
		                        .pid = (uint32_t)kids[i],
		                        .uid = 1000u + (uint32_t)i,
		                        .gid = 1000};
		struct mts_reg_result res;
		if (mts_register(&srv.reg, &peer, groups[i], i == 1 ? "t1" : "",
		                 0x1234u + (uint64_t)i, &res) != 0)
			die("cannot register a child");
		kid_slot[i] = res.slot;
		struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)kids[i]);
		if (!p)
			die("registered child not found");
		kid_start[i] = p->start_time;
		/* What its client would have flushed: i+1 MiB in lane 0,
		 * a little in lane 1 and in overflow. */
		struct mtshm_slot_id *s = mtshm_slot(&srv.map, res.slot);
		mt_store_relaxed32(&s->threads, 3);
		mt_store_relaxed32(&s->lanes_used, 2);
		mt_store_relaxeds64(&s->overflow, 4096);
		mt_store_relaxeds64(&mtshm_lane(s, 0)->bytes, (int64_t)(i + 1)
		                                                  << 20);
		mt_store_relaxeds64(&mtshm_lane(s, 1)->bytes, -12345);
	}
	stride = (size_t)((char *)mtshm_slot(&srv.map, 1) -
	                  (char *)mtshm_slot(&srv.map, 0));
	snapshot = malloc(srv.map.size);
	if (!snapshot)
		die("out of memory");
	memcpy(snapshot, srv.map.base, srv.map.size);
	return 0;
}

static const uint64_t interesting[16] = {
    0,
    1,
    UINT64_MAX,
    (uint64_t)INT64_MAX,
    (uint64_t)INT64_MIN,
    UINT64_C(1) << 62,
    UINT64_C(1) << 40,
    (uint64_t)(-(INT64_C(1) << 40)),
    UINT32_MAX,
    UINT64_C(0x100000000),
    MTSHM_MAX_LANES,
    MTSHM_MAX_LANES + 1u,
    LANES,
    LANES + 1u,
    UINT64_C(0x8000000000000001),
    UINT64_C(0x00000001ffffffff),
};

static void apply(const uint8_t *d, size_t n)
{
	size_t pos = 1;
	while (pos + 3 <= n) {
		uint8_t op = d[pos], off = d[pos + 1], len = d[pos + 2] % 17u;
		pos += 3;
		struct mtshm_slot_id *s = mtshm_slot(&srv.map, op & 3u);
		uint8_t *lines = (uint8_t *)s;
		switch ((op >> 2) & 3u) {
		case 0:   /* identity */
		case 1: { /* identity and lanes */
			size_t span = ((op >> 2) & 3u) == 0
			                  ? sizeof(struct mtshm_slot_id)
			                  : stride;
			size_t at = off % span;
			size_t k = len;
			if (k > n - pos)
				k = n - pos;
			if (k > span - at)
				k = span - at;
			memcpy(lines + at, d + pos, k);
			pos += len < n - pos ? len : n - pos;
			break;
		}
		case 2: { /* names */
			uint8_t *nm = (uint8_t *)mtshm_names(&srv.map, op & 3u);
			size_t k = len;
			if (k > n - pos)
				k = n - pos;
			size_t span = MTSHM_NAMES_STRIDE;
			size_t at = (size_t)off % span;
			if (k > span - at)
				k = span - at;
			if (nm)
				memcpy(nm + at, d + pos, k);
			pos += len < n - pos ? len : n - pos;
			break;
		}
		default: { /* an interesting value, aligned */
			uint64_t v = interesting[op >> 4];
			size_t at = ((size_t)off * 8u) % stride;
			memcpy(lines + at, &v, sizeof(v));
			break;
		}
		}
	}
}

/* The invariants of a registry after a tick. */
static void check_totals(const struct mts_registry *reg)
{
	uint64_t sum = 0, groups = 0;
	for (uint32_t i = 0; i < reg->slot_count; i++) {
		const struct mts_proc *p = reg->by_slot[i];
		if (!p)
			continue;
		if (p->slot != i)
			die("by_slot and the proc disagree on the slot");
		int absurd = 0;
		mtshm_slot_sum(reg->map, mtshm_slot(reg->map, i), NULL,
		               &absurd);
		if (absurd && !p->corrupt)
			die("absurd counters not quarantined");
		if (p->corrupt && p->bytes != 0)
			die("a quarantined slot still counts bytes");
		uint64_t next = sum + p->bytes;
		sum = next < sum ? UINT64_MAX : next;
	}
	if (reg->totals.bytes != sum)
		die("fleet total is not the sum of the counted processes");
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		if (!reg->groups[i].name)
			continue;
		uint64_t next = groups + reg->groups[i].bytes;
		groups = next < groups ? UINT64_MAX : next;
	}
	if (groups != sum)
		die("the groups do not add up to the fleet");
	if (reg->totals.processes != reg->ndense)
		die("process count");
}

/* ListProcesses through the dispatcher: exactly our children. */
static void check_listing(void)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__ListProcesses q = MEMTALLY__V1__LIST_PROCESSES__INIT;
	q.group = (char *)"";
	req.id = 9;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES;
	req.list_processes = &q;
	uint8_t body[64];
	size_t len = memtally__v1__request__pack(&req, body);
	struct mts_peer peer = {.fd = -1,
	                        .has_cred = true,
	                        .pid = (uint32_t)getpid(),
	                        .uid = (uint32_t)getuid(),
	                        .gid = (uint32_t)getgid()};
	struct mts_buf out = {0};
	if (mts_dispatch(&srv.reg, &peer, body, len, &out) != 0)
		die("ListProcesses failed");
	uint64_t blen;
	int n = mtframe_decode_len(out.data, out.len, UINT64_MAX, &blen);
	if (n <= 0)
		die("bad response frame");
	Memtally__V1__Response *r =
	    memtally__v1__response__unpack(NULL, blen, out.data + n);
	if (!r || !r->process_list || r->process_list->n_processes != NKIDS)
		die("ListProcesses does not list the registered processes");
	for (size_t i = 0; i < NKIDS; i++) {
		const Memtally__V1__ProcessInfo *pi =
		    r->process_list->processes[i];
		int found = 0;
		for (int k = 0; k < NKIDS; k++)
			if (pi->pid == (uint32_t)kids[k] &&
			    pi->slot == kid_slot[k] &&
			    pi->start_time == kid_start[k])
				found = 1;
		if (!found)
			die("ListProcesses reports an identity from the slot");
		if (pi->corrupt && pi->bytes)
			die("a quarantined process shows bytes");
	}
	memtally__v1__response__free_unpacked(r, NULL);
	mts_buf_free(&out);
}

/* A restarted server adopts the scribbled segment. */
static void adopt_pass(int untouched)
{
	struct mts_registry reg;
	if (mts_registry_init(&reg, &loop, &srv.map, segname) != 0)
		die("registry init");
	struct mts_policy defaults;
	mts_policy_defaults(&defaults);
	if (mts_limits_apply_policy(&reg, &defaults) != 0)
		die("policy");
	uint32_t kept = 0, dropped = 0;
	mts_adopt(&reg, &kept, &dropped);
	if (kept > SLOTS || kept != reg.ndense)
		die("adopted count");
	if (untouched && kept != NKIDS)
		die("an untouched segment's workers were not all adopted");
	mts_tick(&reg);
	for (uint32_t i = 0; i < reg.slot_count; i++) {
		const struct mts_proc *p = reg.by_slot[i];
		if (!p)
			continue;
		uint64_t st;
		if (mts_read_starttime((pid_t)p->pid, &st) != 0 ||
		    st != p->start_time)
			die("adopted a process that is not the slot's worker");
	}
	check_totals(&reg);
	mts_registry_close(&reg);
	uv_run(&loop, UV_RUN_NOWAIT); /* the pidfd polls' close callbacks */
	mts_registry_free(&reg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* A fresh copy of the registered segment; quarantine is sticky in
	 * the registry until the slot is reset, which the copy stands for. */
	memcpy(srv.map.base, snapshot, srv.map.size);
	for (int i = 0; i < NKIDS; i++) {
		struct mts_proc *p = srv.reg.by_slot[kid_slot[i]];
		p->corrupt = false;
	}
	if (size == 0)
		return 0;
	apply(data, size);

	mts_tick(&srv.reg);
	if (srv.reg.ndense != NKIDS)
		die("the registry lost or gained a process");
	for (int i = 0; i < NKIDS; i++) {
		struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)kids[i]);
		if (!p || p->slot != kid_slot[i] ||
		    p->start_time != kid_start[i] ||
		    srv.reg.by_slot[kid_slot[i]] != p)
			die("the registry's record changed with the slot");
	}
	check_totals(&srv.reg);
	check_listing();
	if (size == 1) {
		/* Nothing scribbled: the harness itself is sound. */
		uint64_t want = 0;
		for (int i = 0; i < NKIDS; i++)
			want += ((uint64_t)(i + 1) << 20) + 4096u - 12345u;
		if (srv.reg.totals.bytes != want)
			die("untouched segment: wrong fleet total");
	}
	if (data[0] & 0x80)
		adopt_pass(size == 1);
	return 0;
}
