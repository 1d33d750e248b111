/*
 * fuzz_slots.c - libFuzzer target: what a worker can write into its uid's
 * slot table, as memtallyd's tick and a restarted memtallyd's adoption
 * read it.
 *
 * fuzz_segment covers the header and the validator; this target keeps a
 * real server and scribbles over slot CONTENTS in its real uid tables:
 * identity fields (pid, uid, start time, generation, flags), client
 * counters (threads, lanes_used, overflow) and lanes (owner, bytes,
 * flushes). Three real child processes are registered through the server
 * core's registry at start (as memtallyd registers workers), each as
 * another uid, so each has its own slot table; each child maps its table
 * as its client would (the descriptor the Registered answer carries).
 * Slot 3 is free. Slots are reached through the addresses the registry
 * computed, mts_slot(&srv.reg, i). Each input is applied to the tables as
 * registered (restored before each input), then:
 *
 *   1. mts_core_tick() on the registry that registered them. Checked: no crash
 *      (ASan/UBSan); the registry is authoritative: the same three pids in
 *      the same slots with the same start times whatever the slot's pid
 *      field now says, and ListProcesses (through mts_dispatch) lists
 *      exactly them; a slot whose total is absurd is quarantined and
 *      counts 0; the fleet total is exactly the sum of the processes that
 *      are not quarantined, and equals the sum of the groups.
 *   2. when the input's first byte has bit 7 set, restart adoption: a
 *      second registry, on a header of its own, adopts the workers as a
 *      restarted memtallyd would (mts_adopt): who they are from the
 *      server's restart record (server/state.c, a file no worker can
 *      write), their tables reopened from the children's own mappings
 *      (/proc/PID/map_files), and ticks. Checked: every process it adopted
 *      is one of the children, in its recorded slot, alive with its
 *      recorded start time, whatever the scribbled slots say; at most the
 *      slot count; the same quarantine and total invariants, and the same
 *      fleet total as the first registry when all were adopted. Reopening
 *      a table through map_files needs CAP_SYS_ADMIN (or
 *      CAP_CHECKPOINT_RESTORE): without it nothing is adopted, and only
 *      "all adopted" is not required (probed once at start).
 *
 * Input: byte 0 = flags, then edits of [op][offset][len][len bytes]:
 *   op & 3        the slot (slot 3 is free: a worker of uid 1000 writes
 *                 it in its own table, where no process of the registry
 *                 lives)
 *   (op >> 2) & 3 0: slot identity (64 bytes), 1: the slot's lines
 *                 (identity and lanes), 2: the same slot index in the
 *                 next uid's table (a worker scribbling the slot of a
 *                 process of another uid in its own table, which the
 *                 server must never read as that process's), 3: an
 *                 8-byte "interesting" value (op >> 4 picks it) at an
 *                 aligned offset of its lines
 *
 * The server (header memfd "mt-fuzzslots-<pid>", 4 slots x 2 lanes, its
 * restart record in a temporary directory) and the children live for the
 * whole run; they are cleaned up at exit.
 */
/* The shared test fixture, without its Criterion part. */
#define FX_NO_CRITERION
#include "../unit/test_server_fixture.h"

#include "memtally.pb-c.h"
#include "mtframe.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NKIDS 3
#define SLOTS 4u
#define LANES 2u

static char tmpdir[64] = "/tmp/mt-fuzzslots-XXXXXX";
static char statepath[128];
static int ready;
static int can_adopt; /* tables can be reopened from the children */
static pid_t kids[NKIDS];
static uint32_t kid_slot[NKIDS];
static uint64_t kid_start[NKIDS];
static struct mts_table *kid_table[NKIDS];
static uint8_t *snapshot[NKIDS]; /* each kid's table as registered */
static size_t stride;            /* bytes from one slot to the next */

static void cleanup(void)
{
	if (!ready)
		return;
	ready = 0;
	for (int i = 0; i < NKIDS; i++) {
		kill(kids[i], SIGKILL);
		waitpid(kids[i], NULL, 0);
		free(snapshot[i]);
	}
	fx_server_close();
	unlink(statepath);
	rmdir(tmpdir);
}

static void die(const char *what)
{
	fprintf(stderr, "fuzz_slots: %s\n", what);
	abort();
}

/* A child that lives until killed (reported once it runs). It maps the
 * table descriptor it is then sent, read-write, as a worker's client
 * maps its uid's table, and says so. *sock: our end. */
static pid_t spawn(int *sock)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		die("socketpair");
	/* The child dies with the fuzzer: a crash must not leave children
	 * that hold its output pipe open (and the test runner waiting). */
	pid_t pid = fx_fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		close(sv[0]);
		char c = 'x';
		if (write(sv[1], &c, 1) != 1)
			_exit(1);
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int))];
		} cm;
		struct iovec iov = {.iov_base = &c, .iov_len = 1};
		struct msghdr mh = {.msg_iov = &iov,
		                    .msg_iovlen = 1,
		                    .msg_control = cm.buf,
		                    .msg_controllen = sizeof(cm.buf)};
		if (recvmsg(sv[1], &mh, 0) != 1)
			_exit(1);
		struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
		int fd;
		struct stat st;
		if (!ch || ch->cmsg_type != SCM_RIGHTS)
			_exit(1);
		memcpy(&fd, CMSG_DATA(ch), sizeof(fd));
		if (fstat(fd, &st) != 0 ||
		    mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
		         MAP_SHARED, fd, 0) == MAP_FAILED)
			_exit(1);
		close(fd);
		c = 'y';
		if (write(sv[1], &c, 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(sv[1]);
	char c;
	if (read(sv[0], &c, 1) != 1)
		die("child did not start");
	*sock = sv[0];
	return pid;
}

/* Hand the child at the other end of `sock` its table descriptor. */
static void send_table(int sock, int fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	memset(&cm, 0, sizeof(cm));
	char c = 't';
	struct iovec iov = {.iov_base = &c, .iov_len = 1};
	struct msghdr mh = {.msg_iov = &iov,
	                    .msg_iovlen = 1,
	                    .msg_control = cm.buf,
	                    .msg_controllen = sizeof(cm.buf)};
	struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
	ch->cmsg_level = SOL_SOCKET;
	ch->cmsg_type = SCM_RIGHTS;
	ch->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(ch), &fd, sizeof(fd));
	if (sendmsg(sock, &mh, 0) != 1 || read(sock, &c, 1) != 1 || c != 'y')
		die("child did not map its table");
	close(sock);
}

static uint32_t adopt_pass(int untouched);

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* Silence the "corrupt, excluded" warnings. */
	mts_log_set_level((enum mts_log_level)(MTS_LOG_ERROR + 1));
	if (!mkdtemp(tmpdir))
		die("mkdtemp");
	snprintf(statepath, sizeof(statepath), "%s/state", tmpdir);
	struct mts_config cfg = fx_config("fuzzslots", SLOTS);
	cfg.lanes = LANES;
	cfg.state_path = statepath;
	cfg.reset = true;
	if (fx_server_open(&cfg) != 0)
		die("cannot start a server");
	if (!srv.reg.state)
		die("the server keeps no restart record");
	/* The untouched allowance's clock at its longest: the children's
	 * claims run ahead of what they hold for the whole fuzz run, and
	 * must count in full, as the harness checks, for the hour at most
	 * a run lasts. */
	struct mts_policy pol;
	mts_policy_defaults(&pol);
	pol.untouched_ms = MTS_UNTOUCHED_MAX_MS;
	if (mts_limits_apply_policy(&srv.reg, &pol) != 0)
		die("policy");
	mts_policy_free(&pol);
	ready = 1;
	atexit(cleanup);
	static const char *const groups[NKIDS] = {"batch", "web", ""};
	for (int i = 0; i < NKIDS; i++) {
		int sock;
		kids[i] = spawn(&sock);
		struct mts_peer peer = {.fd = -1,
		                        .has_cred = true,
		                        .pid = (uint32_t)kids[i],
		                        .uid = 1000u + (uint32_t)i,
		                        .gid = 1000};
		struct mts_reg_result res;
		if (mts_register(&srv.reg, &peer, groups[i], i == 1 ? "t1" : "",
		                 0x1234u + (uint64_t)i, &res) != 0)
			die("cannot register a child");
		send_table(sock, res.fds[1]);
		kid_slot[i] = res.slot;
		struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)kids[i]);
		if (!p)
			die("registered child not found");
		kid_start[i] = p->start_time;
		kid_table[i] = p->table;
		/* What its client would have flushed: i+1 MiB in lane 0,
		 * a little in lane 1 and in overflow. */
		struct mtshm_slot_id *s = mts_slot(&srv.reg, res.slot);
		mtshm_store_relaxed32(&s->threads, 3);
		mtshm_store_relaxed32(&s->lanes_used, 2);
		mtshm_store_relaxeds64(&s->overflow, 4096);
		mtshm_store_relaxeds64(&mtshm_lane(s, 0)->bytes,
		                       (int64_t)(i + 1) << 20);
		mtshm_store_relaxeds64(&mtshm_lane(s, 1)->bytes, -12345);
	}
	if (srv.reg.ntables != NKIDS || kid_table[0] == kid_table[1])
		die("one slot table per uid expected");
	stride = srv.reg.layout.slot_stride;
	for (int i = 0; i < NKIDS; i++) {
		const struct mtshm_map *m = &kid_table[i]->map;
		snapshot[i] = malloc(m->size);
		if (!snapshot[i])
			die("out of memory");
		memcpy(snapshot[i], m->base, m->size);
	}
	/* Whether this process may reopen a worker's table (root, or the
	 * capability): only then must an untouched run adopt everyone. */
	mts_core_tick(&srv.reg);
	can_adopt = adopt_pass(0) == NKIDS;
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

/* The child whose slot is `slot`, or -1 (a free slot). */
static int kid_of(uint32_t slot)
{
	for (int k = 0; k < NKIDS; k++)
		if (kid_slot[k] == slot)
			return k;
	return -1;
}

/* Where an edit of `slot` lands: its process's line through the
 * registry's address, or (free slot) its place in kid 0's table; with
 * `other`, the same index in the next uid's table. */
static uint8_t *slot_lines(uint32_t slot, int other)
{
	int k = kid_of(slot);
	if (!other && k >= 0)
		return (uint8_t *)mts_slot(&srv.reg, slot);
	const struct mts_table *t =
	    kid_table[other ? (k < 0 ? 1 : (k + 1) % NKIDS) : 0];
	return (uint8_t *)mtshm_slot(&srv.reg.layout, t->map.base, slot);
}

static void apply(const uint8_t *d, size_t n)
{
	size_t pos = 1;
	while (pos + 3 <= n) {
		uint8_t op = d[pos], off = d[pos + 1], len = d[pos + 2] % 17u;
		pos += 3;
		uint32_t kind = (op >> 2) & 3u;
		uint8_t *lines = slot_lines(op & 3u, kind == 2);
		switch (kind) {
		case 0:   /* identity */
		case 1:   /* identity and lanes */
		case 2: { /* the slot index in another uid's table */
			size_t span = kind == 0 ? sizeof(struct mtshm_slot_id)
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
/* What the processes claim, whole (not quarantined). */
static uint64_t claims_of(const struct mts_registry *reg)
{
	uint64_t sum = 0;
	for (uint32_t i = 0; i < reg->slot_count; i++) {
		const struct mts_proc *p = reg->by_slot[i];
		if (p && !p->corrupt) {
			uint64_t next = sum + p->bytes;
			sum = next < sum ? UINT64_MAX : next;
		}
	}
	return sum;
}

static void check_totals(const struct mts_registry *reg)
{
	uint64_t sum = 0, groups = 0, unvouched = 0, gunvouched = 0;
	for (uint32_t i = 0; i < reg->slot_count; i++) {
		const struct mts_proc *p = reg->by_slot[i];
		if (!p) {
			if (mts_slot(reg, i))
				die("a free slot has an address");
			continue;
		}
		if (p->slot != i)
			die("by_slot and the proc disagree on the slot");
		struct mtshm_slot_id *s = mts_slot(reg, i);
		if (s != mtshm_slot(&reg->layout, p->table->map.base, i))
			die("a slot outside its uid's table");
		uint64_t flushes;
		int absurd = 0;
		mtshm_slot_sum(s, reg->layout.lane_count, &flushes, &absurd);
		if (absurd && !p->corrupt)
			die("absurd counters not quarantined");
		if (p->corrupt && p->bytes != 0)
			die("a quarantined slot still counts bytes");
		/* What counts toward the fleet: the vouched part of the
		 * claim, and never less than the kernel's figure (the
		 * children's uids are not trusted), a quarantined slot's
		 * included. */
		if (p->unvouched > p->bytes)
			die("more unvouched than claimed");
		if (!p->untrusted && p->unvouched)
			die("a trusted process with unvouched bytes");
		uint64_t counted = p->bytes - p->unvouched;
		if (p->untrusted && counted < p->vouch.kernel)
			counted = p->vouch.kernel;
		if (p->unvouched && counted != p->bytes - p->unvouched)
			die("an unvouched claim counted above itself");
		uint64_t next = sum + counted;
		sum = next < sum ? UINT64_MAX : next;
		next = unvouched + p->unvouched;
		unvouched = next < unvouched ? UINT64_MAX : next;
	}
	if (reg->totals.bytes != sum)
		die("fleet total is not the sum of the counted processes");
	if (reg->totals.unvouched != unvouched)
		die("fleet unvouched is not the sum of the processes'");
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		if (!reg->groups[i].name)
			continue;
		uint64_t next = groups + reg->groups[i].bytes;
		groups = next < groups ? UINT64_MAX : next;
		next = gunvouched + reg->groups[i].unvouched;
		gunvouched = next < gunvouched ? UINT64_MAX : next;
	}
	if (groups != sum || gunvouched != unvouched)
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

/*
 * A restarted server: a header of its own, a registry on it that adopts
 * the workers of the restart record. Returns how many it adopted. The
 * record is put back as the first registry wrote it (adoption clears the
 * entries of workers it could not take).
 */
static uint32_t adopt_pass(int untouched)
{
	char label[96];
	snprintf(label, sizeof(label), "%s-restarted", srv.reg.label);
	struct mtshm_params params = {
	    .slots = SLOTS, .lanes = LANES, .threshold = 1000};
	struct mtshm_map hdr;
	if (mtshm_header_create(label, &params, &hdr) != 0)
		die("header of the restarted server");
	struct mts_registry reg;
	if (mts_core_init(&reg, &loop, &hdr, srv.reg.label,
	                      srv.reg.state) != 0)
		die("registry init");
	reg.instance = srv.reg.instance; /* as the record keeps it */
	struct mts_policy defaults;
	mts_policy_defaults(&defaults);
	if (mts_limits_apply_policy(&reg, &defaults) != 0)
		die("policy");
	uint32_t kept = 0, dropped = 0;
	mts_adopt(&reg, &kept, &dropped);
	if (kept > SLOTS || kept != reg.ndense)
		die("adopted count");
	if (untouched && can_adopt && kept != NKIDS)
		die("an untouched run's workers were not all adopted");
	mts_core_tick(&reg);
	for (uint32_t i = 0; i < reg.slot_count; i++) {
		const struct mts_proc *p = reg.by_slot[i];
		if (!p)
			continue;
		int k = kid_of(i);
		if (k < 0 || p->pid != (uint32_t)kids[k] ||
		    p->start_time != kid_start[k] ||
		    p->uid != 1000u + (uint32_t)k)
			die("adopted a process that is not the slot's worker");
		uint64_t st;
		if (mts_read_starttime((pid_t)p->pid, &st) != 0 ||
		    st != p->start_time)
			die("adopted a process that is not alive as recorded");
	}
	check_totals(&reg);
	/* The claims, whole: what is vouched for starts afresh (no kernel
	 * figure read yet, a new allowance window). */
	if (kept == NKIDS && claims_of(&reg) != claims_of(&srv.reg))
		die("the restarted server counts other totals");
	mts_registry_close(&reg);
	uv_run(&loop, UV_RUN_NOWAIT); /* the pidfd polls' close callbacks */
	mts_core_free(&reg);
	mtshm_close(&hdr);
	for (int k = 0; k < NKIDS; k++)
		mts_registry_record(&srv.reg, srv.reg.by_slot[kid_slot[k]]);
	return kept;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* The tables as registered; quarantine is sticky in the registry
	 * until the slot is reset, which the copy stands for, and so is the
	 * last allocator-free sample read (kept while a sample is being
	 * written) and what it was taken to hold since. */
	for (int i = 0; i < NKIDS; i++) {
		memcpy(kid_table[i]->map.base, snapshot[i],
		       kid_table[i]->map.size);
		struct mts_proc *p = srv.reg.by_slot[kid_slot[i]];
		p->corrupt = false;
		p->has_free = false;
		p->allocator_free = 0;
		p->free_held = (struct mtshm_free_held){0};
	}
	if (size == 0)
		return 0;
	apply(data, size);

	mts_core_tick(&srv.reg);
	if (srv.reg.ndense != NKIDS)
		die("the registry lost or gained a process");
	for (int i = 0; i < NKIDS; i++) {
		struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)kids[i]);
		if (!p || p->slot != kid_slot[i] ||
		    p->start_time != kid_start[i] ||
		    srv.reg.by_slot[kid_slot[i]] != p ||
		    p->table != kid_table[i])
			die("the registry's record changed with the slot");
	}
	check_totals(&srv.reg);
	check_listing();
	if (size == 1) {
		/* Nothing scribbled: the harness itself is sound. */
		/* Each claim, or the kernel's figure where that is more. */
		uint64_t want = 0;
		for (int i = 0; i < NKIDS; i++) {
			uint64_t claim =
			    ((uint64_t)(i + 1) << 20) + 4096u - 12345u;
			const struct mts_proc *p =
			    srv.reg.by_slot[kid_slot[i]];
			uint64_t k = p->untrusted ? p->vouch.kernel : 0;
			want += claim > k ? claim : k;
		}
		if (srv.reg.totals.bytes != want)
			die("untouched tables: wrong fleet total");
	}
	if (data[0] & 0x80)
		adopt_pass(size == 1);
	return 0;
}
