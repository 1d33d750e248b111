/*
 * test_shm_segment.c - mtshm_create/open/close/unlink on real POSIX shared
 * memory, and mtshm_slot_sum on a real mapping.
 *
 * Every test runs in its own process and names its objects after its pid,
 * so tests may run in parallel with each other and with other checkouts;
 * the suite's fini unlinks whatever a test created, pass or fail.
 */
#define _GNU_SOURCE
#include "mtshm.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char name[64];  /* the object most tests create */
static char name2[64]; /* a second one, for tests that need two */

static void make_names(void)
{
	snprintf(name, sizeof(name), "/memtally-test-%ld", (long)getpid());
	snprintf(name2, sizeof(name2), "/memtally-test-%ld-b", (long)getpid());
}

static void unlink_names(void)
{
	shm_unlink(name);
	shm_unlink(name2);
}

TestSuite(segment, .init = make_names, .fini = unlink_names);

static const struct mtshm_params default_params = {
    .slots = 3, .lanes = 5, .threshold = 12345, .mode = 0660, .gid = -1};

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void expect_code(int got, int want, const char *what)
{
	cr_expect_eq(got, want, "%s: got %d (%s), want %d (%s)", what, got,
	             mtshm_strerror(got), want, mtshm_strerror(want));
}

static void create_or_die(const char *n, const struct mtshm_params *p,
                          struct mtshm_map *m)
{
	int err = mtshm_create(n, p, m);
	cr_assert_eq(err, 0, "mtshm_create(%s): %s", n, mtshm_strerror(err));
}

/* Make `n` a raw object holding exactly bytes[0..len), mode 0600. */
static void raw_object(const char *n, const void *bytes, size_t len)
{
	shm_unlink(n);
	int fd = shm_open(n, O_RDWR | O_CREAT | O_EXCL, 0600);
	cr_assert_geq(fd, 0, "shm_open(%s): %s", n, strerror(errno));
	cr_assert_eq(ftruncate(fd, (off_t)len), 0);
	if (len)
		cr_assert_eq(pwrite(fd, bytes, len, 0), (ssize_t)len);
	close(fd);
}

static mode_t mode_of(const char *n)
{
	char path[96];
	struct stat st;
	snprintf(path, sizeof(path), "/dev/shm%s", n);
	cr_assert_eq(stat(path, &st), 0, "stat(%s): %s", path, strerror(errno));
	return st.st_mode & 07777;
}

/* Header fields of a segment created with `p`. */
static void check_header(const struct mtshm_map *m,
                         const struct mtshm_params *p)
{
	const struct mtshm_header *h = m->hdr;
	uint64_t names =
	    MTSHM_HEADER_SIZE + (uint64_t)p->slots * p->lanes * MTSHM_LINE;
	uint64_t size = names + (uint64_t)p->slots * MTSHM_NAMES_STRIDE;
	cr_assert_not_null(h);
	cr_expect_eq(m->base, (void *)h);
	cr_expect_eq(m->size, size);
	cr_expect_eq(h->magic, MTSHM_MAGIC);
	cr_expect_eq(h->version_major, MTSHM_VERSION_MAJOR);
	cr_expect_eq(h->version_minor, MTSHM_VERSION_MINOR);
	cr_expect_eq(h->compat_minor, MTSHM_COMPAT_MINOR);
	cr_expect_eq(h->header_size, MTSHM_HEADER_SIZE);
	cr_expect_eq(h->slot_offset, MTSHM_HEADER_SIZE);
	cr_expect_eq(h->slot_stride, p->lanes * MTSHM_LINE);
	cr_expect_eq(h->slot_count, p->slots);
	cr_expect_eq(h->lane_count, p->lanes);
	cr_expect_eq(h->line_size, MTSHM_LINE);
	cr_expect_eq(h->segment_size, size);
	cr_expect_neq(h->generation, 0);
	cr_expect_eq(h->server_pid, (uint32_t)getpid());
	cr_expect_eq(h->server_uid, (uint32_t)getuid());
	cr_expect_eq(h->threshold, p->threshold);
	/* 1.1: the names region follows the slots. */
	cr_expect_eq(h->names_offset, names);
	cr_expect_eq(h->names_stride, MTSHM_NAMES_STRIDE);
	cr_expect_eq((char *)mtshm_names(m, 1) - (char *)mtshm_names(m, 0),
		     MTSHM_NAMES_STRIDE);
}

Test(segment, create_then_open_read_only_and_read_write)
{
	const struct mtshm_params *p = &default_params;
	struct mtshm_map c, ro, rw;
	uint64_t before = realtime_ns();
	create_or_die(name, p, &c);
	uint64_t after = realtime_ns();
	check_header(&c, p);
	cr_expect(c.hdr->created_ns >= before && c.hdr->created_ns <= after,
	          "created_ns %llu not in [%llu, %llu]",
	          (unsigned long long)c.hdr->created_ns,
	          (unsigned long long)before, (unsigned long long)after);

	int err = mtshm_open(name, 0, &ro);
	cr_assert_eq(err, 0, "open read-only: %s", mtshm_strerror(err));
	check_header(&ro, p);
	err = mtshm_open(name, 1, &rw);
	cr_assert_eq(err, 0, "open read-write: %s", mtshm_strerror(err));
	check_header(&rw, p);
	cr_expect_eq(ro.hdr->generation, c.hdr->generation);
	cr_expect_eq(ro.hdr->created_ns, c.hdr->created_ns);

	/* Three mappings of one object: a store through one is seen by all. */
	struct mtshm_lane *l = mtshm_lane(mtshm_slot(&rw, 2), 4);
	mt_store_relaxeds64(&l->bytes, -4242);
	cr_expect_eq(mtshm_lane(mtshm_slot(&ro, 2), 4)->bytes, -4242);
	cr_expect_eq(mtshm_lane(mtshm_slot(&c, 2), 4)->bytes, -4242);

	/* Everything the creator did not set is zero: fleet, slots and
	 * reserved words alike. */
	const unsigned char *b = ro.base;
	size_t written =
	    (size_t)((unsigned char *)&l->bytes - (unsigned char *)rw.base);
	for (size_t off = 128; off < ro.size; off++)
		if (off < written || off >= written + 8)
			cr_assert_eq(b[off], 0, "byte %zu of a fresh segment",
			             off);

	mtshm_close(&ro);
	mtshm_close(&rw);
	mtshm_close(&c);
	cr_expect_null(c.base);
	cr_expect_eq(c.size, 0);
}

/* A write to a read-only mapping faults; catch it here rather than with
 * Criterion's .signal, since ASan would turn the SIGSEGV into an abort. */
static sigjmp_buf fault_jmp;

static void on_fault(int sig)
{
	siglongjmp(fault_jmp, sig);
}

static int write_faults(uint32_t *p)
{
	struct sigaction sa = {.sa_handler = on_fault}, old_segv, old_bus;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, &old_segv);
	sigaction(SIGBUS, &sa, &old_bus);
	int sig = sigsetjmp(fault_jmp, 1);
	if (sig == 0)
		mt_store_relaxed32(p, 1);
	sigaction(SIGSEGV, &old_segv, NULL);
	sigaction(SIGBUS, &old_bus, NULL);
	return sig != 0;
}

Test(segment, read_only_open_maps_read_only)
{
	struct mtshm_map c, ro, rw;
	create_or_die(name, &default_params, &c);
	cr_assert_eq(mtshm_open(name, 0, &ro), 0);
	cr_assert_eq(mtshm_open(name, 1, &rw), 0);
	/* A read-only opener must not be able to scribble on the segment;
	 * a read-write one must. */
	cr_expect(write_faults(&mtshm_slot(&ro, 0)->pid),
	          "a store through a read-only open did not fault");
	cr_expect_eq(mtshm_slot(&c, 0)->pid, 0);
	cr_expect(!write_faults(&mtshm_slot(&rw, 0)->pid));
	cr_expect_eq(mtshm_slot(&c, 0)->pid, 1);
}

Test(segment, fresh_segment_bytes_at_the_diagram_offsets)
{
	struct mtshm_map c;
	create_or_die(name, &default_params, &c);
	const unsigned char *b = c.base;
	cr_expect_eq(memcmp(b, "MEMTALLY", 8), 0, "magic bytes at 0");
	uint32_t u32;
	uint16_t u16;
	uint64_t u64;
	memcpy(&u16, b + 8, 2);
	cr_expect_eq(u16, MTSHM_VERSION_MAJOR, "version_major at 8");
	memcpy(&u32, b + 20, 4);
	cr_expect_eq(u32, MTSHM_HEADER_SIZE, "slot_offset at 20");
	memcpy(&u32, b + 24, 4);
	cr_expect_eq(u32, 5 * MTSHM_LINE, "slot_stride at 24");
	memcpy(&u32, b + 28, 4);
	cr_expect_eq(u32, 3, "slot_count at 28");
	memcpy(&u32, b + 32, 4);
	cr_expect_eq(u32, 5, "lane_count at 32");
	memcpy(&u64, b + 40, 8);
	cr_expect_eq(u64, c.size, "segment_size at 40");
	memcpy(&u64, b + 72, 8);
	cr_expect_eq(u64, 12345, "threshold at 72");
}

Test(segment, mode_is_exact_despite_umask)
{
	umask(077);
	struct mtshm_map c;
	create_or_die(name, &default_params, &c);
	cr_expect_eq(mode_of(name), 0660, "mode %o, want 0660", mode_of(name));

	struct mtshm_params p = default_params;
	p.mode = 0640;
	struct mtshm_map d;
	create_or_die(name2, &p, &d);
	cr_expect_eq(mode_of(name2), 0640, "mode %o, want 0640",
	             mode_of(name2));
}

Test(segment, group_is_set_when_asked)
{
	/* Root may give the object any group; anyone may give their own. */
	gid_t gid = geteuid() == 0 ? 4321 : getegid();
	struct mtshm_params p = default_params;
	p.gid = (int)gid;
	struct mtshm_map c;
	create_or_die(name, &p, &c);
	char path[96];
	struct stat st;
	snprintf(path, sizeof(path), "/dev/shm%s", name);
	cr_assert_eq(stat(path, &st), 0);
	cr_expect_eq(st.st_gid, gid);
	cr_expect_eq(st.st_mode & 07777, 0660);
}

Test(segment, create_replaces_a_segment_of_another_layout)
{
	struct mtshm_params old_p = {
	    .slots = 2, .lanes = 8, .threshold = 1, .mode = 0600, .gid = -1};
	struct mtshm_map old, c, o;
	create_or_die(name, &old_p, &old);
	uint64_t old_gen = old.hdr->generation;
	mtshm_slot(&old, 1)->pid = 77;

	create_or_die(name, &default_params, &c);
	cr_assert_eq(mtshm_open(name, 0, &o), 0);
	check_header(&o, &default_params);
	cr_expect_eq(mode_of(name), 0660);
	cr_expect_neq(o.hdr->generation, old_gen,
	              "re-creation must draw a new generation");
	cr_expect_eq(mtshm_slot(&o, 1)->pid, 0, "old slot contents leaked");

	/* The old mapping still sees the old object, untouched. */
	cr_expect_eq(old.hdr->lane_count, 8);
	cr_expect_eq(mtshm_slot(&old, 1)->pid, 77);
}

Test(segment, create_replaces_garbage)
{
	unsigned char junk[100];
	memset(junk, 0xee, sizeof(junk));
	raw_object(name, junk, sizeof(junk));
	struct mtshm_map c, o;
	create_or_die(name, &default_params, &c);
	cr_assert_eq(mtshm_open(name, 1, &o), 0);
	check_header(&o, &default_params);
	cr_expect_eq(mode_of(name), 0660);
}

Test(segment, create_rejects_bad_params)
{
	static const struct mtshm_params bad[] = {
	    {.slots = 0, .lanes = 4, .threshold = 1, .mode = 0660},
	    {.slots = MTSHM_MAX_SLOTS + 1,
	     .lanes = 4,
	     .threshold = 1,
	     .mode = 0660},
	    {.slots = 1, .lanes = 0, .threshold = 1, .mode = 0660},
	    {.slots = 1,
	     .lanes = MTSHM_MAX_LANES + 1,
	     .threshold = 1,
	     .mode = 0660},
	    {.slots = 1, .lanes = 4, .threshold = 0, .mode = 0660},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct mtshm_map m;
		memset(&m, 0xa5, sizeof(m));
		expect_code(mtshm_create(name, &bad[i], &m), -EINVAL,
		            "bad params");
		cr_expect_null(m.base, "params %zu: map not cleared", i);
	}
	struct mtshm_map m;
	expect_code(mtshm_create("no-slash", &default_params, &m), -EINVAL,
	            "name without '/'");
	expect_code(mtshm_create(NULL, &default_params, &m), -EINVAL,
	            "NULL name");
	expect_code(mtshm_create(name, NULL, &m), -EINVAL, "NULL params");
	/* Nothing was left behind. */
	cr_expect_eq(shm_open(name, O_RDONLY, 0), -1);
	cr_expect_eq(errno, ENOENT);
}

Test(segment, open_missing_is_enoent)
{
	struct mtshm_map m;
	memset(&m, 0xa5, sizeof(m));
	expect_code(mtshm_open(name, 0, &m), -ENOENT, "missing, read-only");
	cr_expect_null(m.base);
	expect_code(mtshm_open(name, 1, &m), -ENOENT, "missing, read-write");
	expect_code(mtshm_open("no-slash", 0, &m), -EINVAL, "no slash");
	expect_code(mtshm_open(NULL, 0, &m), -EINVAL, "NULL name");
}

/* mtshm_open of a raw object with these bytes. */
static int open_raw(const void *bytes, size_t len)
{
	raw_object(name, bytes, len);
	struct mtshm_map m;
	memset(&m, 0xa5, sizeof(m));
	int err = mtshm_open(name, 0, &m);
	if (err)
		cr_expect_null(m.base, "a failed open must leave no mapping");
	else
		mtshm_close(&m);
	return err;
}

Test(segment, open_rejects_garbage_and_short_objects)
{
	static unsigned char buf[8192];
	expect_code(open_raw(buf, 0), MTSHM_EBADMAGIC, "empty object");
	memcpy(buf, "MEMT", 4);
	expect_code(open_raw(buf, 4), MTSHM_EBADMAGIC, "4-byte object");
	memset(buf, 0xa5, sizeof(buf));
	expect_code(open_raw(buf, sizeof(buf)), MTSHM_EBADMAGIC,
	            "8 KiB of 0xa5");
	memset(buf, 0, sizeof(buf));
	expect_code(open_raw(buf, sizeof(buf)), MTSHM_EBADMAGIC,
	            "8 KiB of zeros (a creator that has not finished)");
	memcpy(buf, "MEMTALLY", 8);
	expect_code(open_raw(buf, 100), MTSHM_ETRUNCATED,
	            "magic in a 100-byte object");
	memcpy(buf, "YLLATMEM", 8);
	expect_code(open_raw(buf, sizeof(buf)), MTSHM_EBYTEORDER,
	            "byte-swapped magic");
}

Test(segment, open_rejects_a_shrunk_segment)
{
	struct mtshm_map c, o;
	create_or_die(name, &default_params, &c);
	int fd = shm_open(name, O_RDWR, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, (off_t)(c.size - MTSHM_LINE)), 0);
	close(fd);
	expect_code(mtshm_open(name, 0, &o), MTSHM_ETRUNCATED,
	            "one line cut off");
	cr_expect_null(o.base);
}

Test(segment, close_and_unlink_edge_cases)
{
	struct mtshm_map m;
	memset(&m, 0, sizeof(m));
	mtshm_close(&m); /* zeroed */
	mtshm_close(NULL);
	create_or_die(name, &default_params, &m);
	mtshm_close(&m);
	mtshm_close(&m); /* already closed */
	cr_expect_eq(mtshm_unlink(name), 0);
	expect_code(mtshm_unlink(name), -ENOENT, "second unlink");
}

Test(segment, strerror_names_each_code)
{
	static const int codes[] = {MTSHM_EBADMAGIC, MTSHM_EVERSION,
	                            MTSHM_ETRUNCATED, MTSHM_ELAYOUT,
	                            MTSHM_EBYTEORDER};
	for (size_t i = 0; i < 5; i++) {
		cr_assert_not_null(mtshm_strerror(codes[i]));
		for (size_t j = 0; j < i; j++)
			cr_expect_str_neq(mtshm_strerror(codes[i]),
			                  mtshm_strerror(codes[j]));
	}
	cr_expect_str_eq(mtshm_strerror(-ENOENT), strerror(ENOENT));
	cr_expect_str_eq(mtshm_strerror(0), "success");
}

Test(segment, fleet_read_of_a_quiet_header)
{
	struct mtshm_map c;
	create_or_die(name, &default_params, &c);
	struct mtshm_fleet *f = &c.hdr->fleet;
	f->bytes = 11;
	f->peak = 22;
	f->limit = 33;
	f->reserved = 44;
	f->error_bytes = 55;
	f->heartbeat_ns = 66;
	f->ticks = 77;
	f->state = MTSHM_STATE_OVER;
	f->processes = 88;
	f->unregistered = 99;
	f->seq = 10;
	struct mtshm_fleet out;
	memset(&out, 0, sizeof(out));
	mtshm_fleet_read(c.hdr, &out);
	cr_expect_eq(out.seq, 10);
	cr_expect_eq(out.bytes, 11);
	cr_expect_eq(out.peak, 22);
	cr_expect_eq(out.limit, 33);
	cr_expect_eq(out.reserved, 44);
	cr_expect_eq(out.error_bytes, 55);
	cr_expect_eq(out.heartbeat_ns, 66);
	cr_expect_eq(out.ticks, 77);
	cr_expect_eq(out.state, MTSHM_STATE_OVER);
	cr_expect_eq(out.processes, 88);
	cr_expect_eq(out.unregistered, 99);
}

/* --- mtshm_slot_sum --------------------------------------------------- */

#define ABSURD MTSHM_ABSURD_BYTES

/* Fill slot 0 of a fresh 1 x 4 segment and sum it. */
struct sum_result {
	int64_t sum;
	uint64_t flushes;
	int absurd;
};

static struct sum_result sum_of(int64_t overflow, uint32_t used,
                                const int64_t bytes[4])
{
	struct mtshm_params p = default_params;
	p.slots = 1;
	p.lanes = 4;
	struct mtshm_map m;
	create_or_die(name, &p, &m);
	mtshm_unlink(name); /* in case the sum crashes, before fini */
	struct mtshm_slot_id *s = mtshm_slot(&m, 0);
	s->overflow = overflow;
	s->lanes_used = used;
	for (uint32_t k = 0; k < 4; k++) {
		mtshm_lane(s, k)->bytes = bytes[k];
		mtshm_lane(s, k)->flushes = (uint64_t)1 << k;
	}
	struct sum_result r = {.flushes = 999, .absurd = -1};
	r.sum = mtshm_slot_sum(&m, s, &r.flushes, &r.absurd);
	mtshm_close(&m);
	return r;
}

Test(segment, slot_sum_of_sane_counters)
{
	struct sum_result r = sum_of(7, 3, (int64_t[]){100, -50, 20, 1000});
	cr_expect_eq(r.sum, 7 + 100 - 50 + 20, "lane 3 is beyond lanes_used");
	cr_expect_eq(r.flushes, 1 + 2 + 4);
	cr_expect_eq(r.absurd, 0);

	r = sum_of(0, 0, (int64_t[]){5, 5, 5, 5});
	cr_expect_eq(r.sum, 0);
	cr_expect_eq(r.flushes, 0);
	cr_expect_eq(r.absurd, 0);
}

Test(segment, slot_sum_limit_itself_is_sane)
{
	struct sum_result r = sum_of(0, 1, (int64_t[]){ABSURD, 0, 0, 0});
	cr_expect_eq(r.sum, ABSURD);
	cr_expect_eq(r.absurd, 0);
	r = sum_of(-ABSURD, 1, (int64_t[]){0, 0, 0, 0});
	cr_expect_eq(r.sum, -ABSURD);
	cr_expect_eq(r.absurd, 0);
}

Test(segment, slot_sum_excludes_absurd_lanes)
{
	static const int64_t absurd_values[] = {ABSURD + 1, -ABSURD - 1,
	                                        INT64_MAX, INT64_MIN};
	for (size_t i = 0; i < 4; i++) {
		int64_t v = absurd_values[i];
		struct sum_result r = sum_of(7, 4, (int64_t[]){100, v, -50, 3});
		cr_expect_eq(r.sum, 7 + 100 - 50 + 3,
		             "lane of %lld not excluded: sum %lld",
		             (long long)v, (long long)r.sum);
		cr_expect_eq(r.absurd, 1, "lane of %lld not flagged",
		             (long long)v);
		cr_expect_eq(r.flushes, 15);
	}
}

Test(segment, slot_sum_excludes_absurd_overflow)
{
	static const int64_t absurd_values[] = {ABSURD + 1, -ABSURD - 1,
	                                        INT64_MAX, INT64_MIN};
	for (size_t i = 0; i < 4; i++) {
		int64_t v = absurd_values[i];
		struct sum_result r = sum_of(v, 2, (int64_t[]){100, 23, 0, 0});
		cr_expect_eq(r.sum, 123, "overflow of %lld not excluded",
		             (long long)v);
		cr_expect_eq(r.absurd, 1, "overflow of %lld not flagged",
		             (long long)v);
	}
}

Test(segment, slot_sum_flags_an_absurd_total)
{
	/* Each part sane, the whole beyond 1 PiB. */
	struct sum_result r =
	    sum_of(ABSURD, 2, (int64_t[]){ABSURD, ABSURD, 0, 0});
	cr_expect_eq(r.absurd, 1);
}

Test(segment, slot_sum_clamps_lanes_used_to_lane_count)
{
	/* One slot of 32 lanes: 4096 + 4096 bytes, then 256 bytes of names
	 * (1.1); lanes far past lane_count would be on a page beyond the
	 * object (SIGBUS). */
	struct mtshm_params p = default_params;
	p.slots = 1;
	p.lanes = 32;
	struct mtshm_map m;
	create_or_die(name, &p, &m);
	mtshm_unlink(name); /* in case the sum crashes, before fini */
	cr_assert_eq(m.size, 8192 + MTSHM_NAMES_STRIDE);
	struct mtshm_slot_id *s = mtshm_slot(&m, 0);
	s->lanes_used = UINT32_MAX;
	for (uint32_t k = 0; k < 32; k++) {
		mtshm_lane(s, k)->bytes = k + 1;
		mtshm_lane(s, k)->flushes = 1;
	}
	uint64_t flushes = 0;
	int absurd = -1;
	cr_expect_eq(mtshm_slot_sum(&m, s, &flushes, &absurd), 32 * 33 / 2);
	cr_expect_eq(flushes, 32);
	cr_expect_eq(absurd, 0);
}
