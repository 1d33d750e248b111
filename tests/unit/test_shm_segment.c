/*
 * test_shm_segment.c - the segment's objects (shm/segment.c): a header
 * only its creator can write, slot tables nobody can resize, validation,
 * the private layout copy, the fleet seqlock and the slot sum.
 *
 * The isolation checks here try, as a worker could, every way of writing
 * or resizing what it was handed: each must fail, and the creator's own
 * mapping must keep working.
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
#include <unistd.h>

static const struct mtshm_params default_params = {
    .slots = 3, .lanes = 5, .threshold = 12345};

static void expect_code(int got, int want, const char *what)
{
	cr_expect_eq(got, want, "%s: got %d (%s), want %d (%s)", what, got,
	             mtshm_strerror(got), want, mtshm_strerror(want));
}

static void header_or_die(const struct mtshm_params *p, struct mtshm_map *m)
{
	int err = mtshm_header_create("mt-test", p, m);
	cr_assert_eq(err, 0, "mtshm_header_create: %s", mtshm_strerror(err));
}

static void layout_or_die(const struct mtshm_map *h, struct mtshm_layout *l)
{
	int err = mtshm_layout_read(h->base, h->size, l);
	cr_assert_eq(err, 0, "mtshm_layout_read: %s", mtshm_strerror(err));
}

static sigjmp_buf fault_jmp;

static void on_fault(int sig)
{
	siglongjmp(fault_jmp, sig);
}

/* Does a store to `p` fault? */
static int write_faults(volatile uint32_t *p)
{
	struct sigaction sa = {.sa_handler = on_fault}, old_segv, old_bus;
	sigaction(SIGSEGV, &sa, &old_segv);
	sigaction(SIGBUS, &sa, &old_bus);
	int faulted = 0;
	if (sigsetjmp(fault_jmp, 1) == 0)
		*p = 0xdead;
	else
		faulted = 1;
	sigaction(SIGSEGV, &old_segv, NULL);
	sigaction(SIGBUS, &old_bus, NULL);
	return faulted;
}

Test(segment, header_bytes_at_the_diagram_offsets)
{
	struct mtshm_map m;
	header_or_die(&default_params, &m);
	const uint8_t *b = m.base;
	uint64_t magic;
	uint16_t major, minor;
	uint32_t stride, count, lanes, line;
	uint64_t tsize, threshold;
	memcpy(&magic, b + 0, 8);
	memcpy(&major, b + 8, 2);
	memcpy(&minor, b + 10, 2);
	memcpy(&stride, b + 24, 4);
	memcpy(&count, b + 28, 4);
	memcpy(&lanes, b + 32, 4);
	memcpy(&line, b + 36, 4);
	memcpy(&tsize, b + 40, 8);
	memcpy(&threshold, b + 72, 8);
	cr_expect_eq(memcmp(b, "MEMTALLY", 8), 0);
	cr_expect_eq(magic, MTSHM_MAGIC);
	cr_expect_eq(major, 2);
	/* 2.2 (mapped bytes in 2.1, the allocator's free bytes in 2.2),
	 * still readable by a 2.0 reader: compat 0. */
	cr_expect_eq(minor, 2);
	cr_expect_eq(b[12] | b[13] << 8, 0, "compat_minor");
	cr_expect_eq(stride, 5 * 128);
	cr_expect_eq(count, 3);
	cr_expect_eq(lanes, 5);
	cr_expect_eq(line, 128);
	cr_expect_eq(tsize, 3 * 5 * 128);
	cr_expect_eq(threshold, 12345);
	cr_expect_eq(m.size, MTSHM_HEADER_SIZE);
	cr_expect_gt(m.fd, 2, "objects stay off stdio descriptors");
	struct mtshm_layout l;
	layout_or_die(&m, &l);
	cr_expect_eq(l.slot_count, 3);
	cr_expect_eq(l.lane_count, 5);
	cr_expect_eq(l.slot_stride, 640);
	cr_expect_eq(l.table_size, 1920);
	cr_expect_eq(l.threshold, 12345);
	cr_expect_eq(l.generation, m.hdr->generation);
	cr_expect_neq(l.generation, 0);
	mtshm_close(&m);
	cr_expect_null(m.base);
	cr_expect_eq(m.fd, -1);
}

Test(segment, header_is_sealed_and_only_its_creator_writes_it)
{
	struct mtshm_map m;
	header_or_die(&default_params, &m);
	int seals = fcntl(m.fd, F_GET_SEALS);
	cr_assert_eq(seals & MTSHM_SEALS_HEADER, MTSHM_SEALS_HEADER,
	             "seals 0x%x", seals);
	/* The creator's mapping, made before the seal, still writes. */
	cr_expect_eq(write_faults(&m.hdr->fleet.spare0), 0);

	int ro = mtshm_reopen_ro(m.fd);
	cr_assert_geq(ro, 0);
	int fds[] = {m.fd, ro};
	for (int i = 0; i < 2; i++) {
		int fd = fds[i];
		errno = 0;
		cr_expect_eq(
		    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
		    MAP_FAILED, "writable mapping of fd %d", i);
		cr_expect_eq(ftruncate(fd, 0), -1, "shrink fd %d", i);
		cr_expect_eq(ftruncate(fd, 1 << 20), -1, "grow fd %d", i);
		cr_expect_eq(pwrite(fd, "x", 1, 0), -1, "write fd %d", i);
		cr_expect_eq(
		    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
		              4096),
		    -1, "punch fd %d", i);
		cr_expect_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1,
		             "more seals on fd %d", i);
	}
	/* A descriptor reopened read-write through /proc is no better. */
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", ro);
	int rw = open(path, O_RDWR);
	if (rw >= 0) {
		cr_expect_eq(
		    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0),
		    MAP_FAILED);
		cr_expect_eq(write(rw, "x", 1), -1);
		close(rw);
	}
	/* A read-only mapping cannot be made writable. */
	struct mtshm_map r;
	cr_assert_eq(
	    mtshm_map_fd(ro, MTSHM_SEALS_HEADER, MTSHM_HEADER_SIZE, &r), 0);
	cr_expect_eq(mprotect(r.base, 4096, PROT_READ | PROT_WRITE), -1);
	cr_expect_eq(write_faults((uint32_t *)r.base + 100), 1);
	/* ... and it sees the creator's writes. */
	struct mtshm_fleet f = {.bytes = 777, .processes = 3};
	mtshm_fleet_publish(m.hdr, &f);
	struct mtshm_fleet got;
	cr_assert_eq(mtshm_fleet_read(r.hdr, &got), 0);
	cr_expect_eq(got.bytes, 777);
	cr_expect_eq(got.processes, 3);
	mtshm_close(&r);
	close(ro);
	mtshm_close(&m);
}

Test(segment, table_is_sealed_against_resizing)
{
	struct mtshm_map h, t;
	header_or_die(&default_params, &h);
	struct mtshm_layout l;
	layout_or_die(&h, &l);
	cr_assert_eq(mtshm_table_create("mt-test-slots", &l, &t), 0);
	cr_expect_eq(t.size, l.table_size);
	cr_expect_null(t.hdr);
	int seals = fcntl(t.fd, F_GET_SEALS);
	cr_expect_eq(seals & MTSHM_SEALS_TABLE, MTSHM_SEALS_TABLE);
	cr_expect_eq(seals & F_SEAL_FUTURE_WRITE, 0, "tables are writable");
	cr_expect_eq(ftruncate(t.fd, 0), -1);
	cr_expect_eq(errno, EPERM);
	cr_expect_eq(ftruncate(t.fd, (off_t)l.table_size * 2), -1);
	cr_expect_eq(fcntl(t.fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
	/* A second mapping, as a worker makes it: same object, writable,
	 * and the writes are shared. */
	struct mtshm_map w;
	cr_assert_eq(mtshm_map_fd(t.fd, MTSHM_SEALS_TABLE, l.table_size, &w),
	             0);
	cr_expect_eq(w.ino, t.ino);
	cr_expect_eq(w.dev, t.dev);
	mtshm_slot(&l, w.base, 2)->threads = 9;
	cr_expect_eq(mtshm_slot(&l, t.base, 2)->threads, 9);
	mtshm_close(&w);
	mtshm_close(&t);
	mtshm_close(&h);
}

/* Is the page at `p` mapped at all? (mincore fails with ENOMEM on a
 * hole.) */
static int mapped(void *p)
{
	unsigned char v;
	return mincore(p, 4096, &v) == 0;
}

Test(segment, window_maps_one_slot_between_guards)
{
	/* 40 slots of 4 lanes: 512-byte slots, eight to a page. */
	struct mtshm_params p = {.slots = 40, .lanes = 4, .threshold = 1};
	struct mtshm_map h, t, w;
	header_or_die(&p, &h);
	struct mtshm_layout l;
	layout_or_die(&h, &l);
	cr_assert_eq(mtshm_table_create("t", &l, &t), 0);
	uint64_t off = 17 * (uint64_t)l.slot_stride; /* 8704: third page */
	int err = mtshm_map_window(t.fd, l.table_size, off,
	                           (uint64_t)l.lane_count * MTSHM_LINE,
	                           MTSHM_GUARD, &w);
	cr_assert_eq(err, 0, "%s", mtshm_strerror(err));
	cr_expect_eq(w.off, 8192);
	cr_expect_eq(w.size, 4096);
	cr_expect_eq(w.guard, MTSHM_GUARD);
	cr_expect_eq(w.ino, t.ino);
	/* The slot through the window is the slot in the table. */
	struct mtshm_slot_id *s =
	    (struct mtshm_slot_id *)((char *)w.base + (off - w.off));
	s->threads = 7;
	cr_expect_eq(mtshm_slot(&l, t.base, 17)->threads, 7);
	/* Right below and right above the page, and the guards' far ends:
	 * nothing writable, not even the neighbouring pages of the table. */
	char *b = w.base;
	cr_expect_eq(write_faults((uint32_t *)(b - 4)), 1, "below the window");
	cr_expect_eq(write_faults((uint32_t *)(b + w.size)), 1,
	             "above the window");
	cr_expect_eq(write_faults((uint32_t *)(b - MTSHM_GUARD)), 1,
	             "the lower guard's start");
	cr_expect_eq(write_faults((uint32_t *)(b + w.size + MTSHM_GUARD - 4)),
	             1, "the upper guard's end");
	cr_expect_eq(mtshm_slot(&l, t.base, 15)->threads, 0);
	cr_expect_eq(mtshm_slot(&l, t.base, 24)->threads, 0);
	char *lo = b - MTSHM_GUARD;
	mtshm_close(&w);
	cr_expect_not(mapped(lo), "the guard is released with it");
	cr_expect_not(mapped(b), "the window is released");

	/* A slot across a page boundary gets both pages; a range outside
	 * the table, or an unsealed object, nothing. */
	cr_assert_eq(
	    mtshm_map_window(t.fd, l.table_size, 4096 - 128, 512, 0, &w), 0);
	cr_expect_eq(w.off, 0);
	cr_expect_eq(w.size, 8192);
	mtshm_close(&w);
	expect_code(mtshm_map_window(t.fd, l.table_size, l.table_size - 256,
	                             512, 0, &w),
	            MTSHM_ELAYOUT, "a range past the end");
	cr_expect_null(w.base);
	expect_code(mtshm_map_window(t.fd, l.table_size + 128, 0, 512, 0, &w),
	            MTSHM_ETRUNCATED, "a table of another size");
	int plain = memfd_create("plain", MFD_CLOEXEC);
	cr_assert_eq(ftruncate(plain, 4096), 0);
	expect_code(mtshm_map_window(plain, 4096, 0, 512, 0, &w),
	            MTSHM_EUNSEALED, "an unsealed object");
	close(plain);
	mtshm_close(&t);
	mtshm_close(&h);
}

Test(segment, map_fd_refuses_what_could_be_resized)
{
	/* An unsealed memfd, a sealable one without the seals, a regular
	 * file, a table of the wrong size, a table passed as a header. */
	int plain = memfd_create("plain", MFD_CLOEXEC);
	cr_assert_geq(plain, 0);
	cr_assert_eq(ftruncate(plain, 4096), 0);
	struct mtshm_map m;
	expect_code(mtshm_map_fd(plain, MTSHM_SEALS_TABLE, 0, &m),
	            MTSHM_EUNSEALED, "unsealed memfd");
	cr_expect_null(m.base);
	int partial = memfd_create("partial", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_eq(ftruncate(partial, 4096), 0);
	cr_assert_eq(fcntl(partial, F_ADD_SEALS, F_SEAL_GROW), 0);
	expect_code(mtshm_map_fd(partial, MTSHM_SEALS_TABLE, 0, &m),
	            MTSHM_EUNSEALED, "shrinkable memfd");
	char tmp[] = "/tmp/mt-seg-XXXXXX";
	int file = mkstemp(tmp);
	cr_assert_geq(file, 0);
	unlink(tmp);
	cr_assert_eq(ftruncate(file, 4096), 0);
	expect_code(mtshm_map_fd(file, MTSHM_SEALS_TABLE, 0, &m),
	            MTSHM_EUNSEALED, "regular file");

	struct mtshm_map h, t;
	header_or_die(&default_params, &h);
	struct mtshm_layout l;
	layout_or_die(&h, &l);
	cr_assert_eq(mtshm_table_create("t", &l, &t), 0);
	expect_code(
	    mtshm_map_fd(t.fd, MTSHM_SEALS_TABLE, l.table_size + 128, &m),
	    MTSHM_ETRUNCATED, "table of another size");
	expect_code(mtshm_map_fd(t.fd, MTSHM_SEALS_HEADER, 0, &m),
	            MTSHM_EUNSEALED, "a table is no header");
	/* A header is validated as it is mapped. */
	cr_assert_eq(mtshm_map_fd(h.fd, MTSHM_SEALS_HEADER, 0, &m), 0);
	cr_expect_eq(m.hdr->slot_count, 3);
	mtshm_close(&m);
	close(plain);
	close(partial);
	close(file);
	mtshm_close(&t);
	mtshm_close(&h);
}

Test(segment, map_fd_refuses_a_huge_page_memfd)
{
	/* Sealed, regular, of the exact size, but of huge pages: a window of
	 * it would be mapped 2 MiB long, past the window's guard. */
	int huge =
	    memfd_create("huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
	if (huge < 0)
		cr_skip_test("no huge-page memfd here: %s", strerror(errno));
	if (ftruncate(huge, 2u << 20) != 0 ||
	    fcntl(huge, F_ADD_SEALS, MTSHM_SEALS_TABLE) != 0) {
		int e = errno;
		close(huge);
		cr_skip_test("cannot size or seal a huge-page memfd: %s",
		             strerror(e));
	}
	struct mtshm_map m;
	expect_code(mtshm_map_fd(huge, MTSHM_SEALS_TABLE, 2u << 20, &m),
	            MTSHM_EUNSEALED, "huge-page memfd");
	cr_expect_null(m.base);
	expect_code(mtshm_map_window(huge, 2u << 20, 0, 4096, 1u << 20, &m),
	            MTSHM_EUNSEALED, "a window of a huge-page memfd");
	close(huge);
}

Test(segment, create_rejects_bad_params)
{
	struct mtshm_map m;
	struct mtshm_params p = default_params;
	p.slots = 0;
	expect_code(mtshm_header_create("x", &p, &m), -EINVAL, "0 slots");
	p = default_params;
	p.slots = MTSHM_MAX_SLOTS + 1;
	expect_code(mtshm_header_create("x", &p, &m), -EINVAL, "slots");
	p = default_params;
	p.lanes = 0;
	expect_code(mtshm_header_create("x", &p, &m), -EINVAL, "0 lanes");
	p.lanes = MTSHM_MAX_LANES + 1;
	expect_code(mtshm_header_create("x", &p, &m), -EINVAL, "lanes");
	p = default_params;
	p.threshold = 0;
	expect_code(mtshm_header_create("x", &p, &m), -EINVAL, "threshold");
	expect_code(mtshm_header_create(NULL, &default_params, &m), -EINVAL,
	            "label");
	struct mtshm_layout l = {
	    .slot_count = 2, .slot_stride = 128, .table_size = 300};
	expect_code(mtshm_table_create("x", &l, &m), -EINVAL, "table size");
	cr_expect_null(m.base);
}

/* A valid header image to break one field at a time. */
static void good_header(struct mtshm_header *h)
{
	struct mtshm_map m;
	header_or_die(&default_params, &m);
	memcpy(h, m.base, sizeof(*h));
	mtshm_close(&m);
}

Test(segment, validate_rejects_garbage_and_impossible_layouts)
{
	static struct mtshm_header h;
	good_header(&h);
	expect_code(mtshm_validate(&h, sizeof(h)), 0, "good");
	expect_code(mtshm_validate(&h, 4), MTSHM_EBADMAGIC, "tiny");
	expect_code(mtshm_validate(&h, 100), MTSHM_ETRUNCATED, "short");
	for (int i = 0; i < 9; i++) {
		good_header(&h);
		int want = MTSHM_ELAYOUT;
		switch (i) {
		case 0:
			h.magic = 1;
			want = MTSHM_EBADMAGIC;
			break;
		case 1:
			h.magic = MTSHM_MAGIC_SWAPPED;
			want = MTSHM_EBYTEORDER;
			break;
		case 2:
			h.version_major = 1;
			want = MTSHM_EVERSION;
			break;
		case 3:
			h.compat_minor = MTSHM_VERSION_MINOR + 1;
			want = MTSHM_EVERSION;
			break;
		case 4:
			h.lane_count = 0;
			break;
		case 5:
			h.lane_count = MTSHM_MAX_LANES + 1;
			break;
		case 6:
			h.slot_stride = 64;
			break;
		case 7:
			h.slot_count = 0;
			break;
		case 8:
			h.table_size++;
			break;
		}
		char what[16];
		snprintf(what, sizeof(what), "case %d", i);
		expect_code(mtshm_validate(&h, sizeof(h)), want, what);
		struct mtshm_layout l;
		memset(&l, 0xff, sizeof(l));
		expect_code(mtshm_layout_read(&h, sizeof(h), &l), want, what);
		cr_expect_eq(l.slot_count, 0, "layout zeroed on failure");
		cr_expect_eq(l.table_size, 0);
	}
}

Test(segment, strerror_names_each_code)
{
	int codes[] = {MTSHM_EBADMAGIC, MTSHM_EVERSION,   MTSHM_ETRUNCATED,
	               MTSHM_ELAYOUT,   MTSHM_EBYTEORDER, MTSHM_EUNSEALED};
	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		cr_expect_neq(strstr(mtshm_strerror(codes[i]), "memtally"),
		              NULL, "code %d", codes[i]);
	cr_expect_str_eq(mtshm_strerror(-ENOENT), strerror(ENOENT));
	cr_expect_str_eq(mtshm_strerror(0), "success");
}

Test(segment, close_edge_cases)
{
	mtshm_close(NULL);
	struct mtshm_map z;
	memset(&z, 0, sizeof(z));
	mtshm_close(&z); /* a zeroed map: fd 0 is not ours to close */
	cr_expect_neq(fcntl(0, F_GETFD), -1, "stdin still open");
	struct mtshm_map m;
	header_or_die(&default_params, &m);
	mtshm_close(&m);
	mtshm_close(&m);
}

/* ---- slot sums ------------------------------------------------------ */

struct sum_result {
	int64_t sum;
	uint64_t flushes;
	int absurd;
};

static _Alignas(128) uint8_t slot_mem[4 * MTSHM_LINE];

static struct sum_result sum_of(int64_t overflow, uint32_t used,
                                const int64_t *lanes, uint32_t n)
{
	memset(slot_mem, 0, sizeof(slot_mem));
	struct mtshm_slot_id *s = (struct mtshm_slot_id *)slot_mem;
	s->overflow = overflow;
	s->lanes_used = used;
	for (uint32_t k = 0; k < n; k++) {
		mtshm_lane(s, k)->bytes = lanes[k];
		mtshm_lane(s, k)->flushes = k + 1;
	}
	struct sum_result r;
	r.sum = mtshm_slot_sum(s, 4, &r.flushes, &r.absurd);
	return r;
}

Test(segment, slot_sum_of_sane_counters)
{
	int64_t lanes[] = {1000, -300, 50};
	struct sum_result r = sum_of(7, 3, lanes, 3);
	cr_expect_eq(r.sum, 757);
	cr_expect_eq(r.flushes, 6);
	cr_expect_eq(r.absurd, 0);
}

Test(segment, slot_sum_limit_itself_is_sane)
{
	int64_t lanes[] = {MTSHM_ABSURD_BYTES};
	struct sum_result r = sum_of(0, 1, lanes, 1);
	cr_expect_eq(r.sum, MTSHM_ABSURD_BYTES);
	cr_expect_eq(r.absurd, 0);
	lanes[0] = -MTSHM_ABSURD_BYTES;
	r = sum_of(0, 1, lanes, 1);
	cr_expect_eq(r.absurd, 0);
}

/* A producer thread's lane climbs for ever while a consumer's falls: each
 * lane alone is far past the absurd mark, even wrapped round int64, but
 * the process holds 4 KiB. */
Test(segment, slot_sum_judges_the_total_not_a_lane)
{
	int64_t lanes[] = {INT64_C(3) << 61, -(INT64_C(3) << 61) + 4096};
	struct sum_result r = sum_of(0, 2, lanes, 2);
	cr_expect_eq(r.absurd, 0);
	cr_expect_eq(r.sum, 4096);
	/* Past int64 on the way (a lane that wrapped): still exact. */
	int64_t wrapped[] = {INT64_MAX, INT64_MAX, 2 + 8192};
	r = sum_of(0, 3, wrapped, 3);
	cr_expect_eq(r.absurd, 0);
	cr_expect_eq(r.sum, 8192);
	int64_t with_overflow[] = {INT64_C(1) << 55};
	r = sum_of(-(INT64_C(1) << 55) + 100, 1, with_overflow, 1);
	cr_expect_eq(r.absurd, 0);
	cr_expect_eq(r.sum, 100);
}

Test(segment, slot_sum_flags_an_absurd_total)
{
	int64_t lanes[] = {MTSHM_ABSURD_BYTES, 1};
	struct sum_result r = sum_of(0, 2, lanes, 2);
	cr_expect_eq(r.absurd, 1);
	int64_t neg[] = {-MTSHM_ABSURD_BYTES - 1};
	r = sum_of(0, 1, neg, 1);
	cr_expect_eq(r.absurd, 1);
	r = sum_of(INT64_MIN, 0, NULL, 0);
	cr_expect_eq(r.absurd, 1);
}

Test(segment, slot_sum_clamps_lanes_used_to_lane_count)
{
	int64_t lanes[] = {1, 2, 3, 4};
	/* lanes_used is written by the client: a huge value must not walk
	 * past the slot. */
	struct sum_result r = sum_of(0, UINT32_MAX, lanes, 4);
	cr_expect_eq(r.sum, 10);
	cr_expect_eq(r.flushes, 10);
	r = sum_of(0, 2, lanes, 4);
	cr_expect_eq(r.sum, 3);
}

/* Lane 0's free-bytes sample (2.2): what the allocator held at the sample,
 * raised by any larger heap since, less the heap now. */
Test(segment, allocator_free_follows_the_heap_from_its_sample)
{
	_Alignas(128) uint8_t line[2 * MTSHM_LINE];
	memset(line, 0, sizeof(line));
	struct mtshm_slot_id *s = (struct mtshm_slot_id *)line;
	struct mtshm_lane *l = mtshm_lane(s, 0);
	const uint64_t mib = 1u << 20;
	struct mtshm_free_held h = {0};
	uint64_t f = 77;
	int absurd = 1;
	/* Never sampled: all zero, 0 free whatever the heap. */
	cr_expect_eq(mtshm_free_now(s, 500 * mib, &h, &f, &absurd), 1);
	cr_expect_eq(f, 0);
	cr_expect_eq(absurd, 0);
	/* 10 MiB free when the heap was 100 MiB: 110 MiB held. */
	l->free_seq = 2;
	l->free_bytes = (int64_t)(10 * mib);
	l->free_heap = (int64_t)(100 * mib);
	struct {
		uint64_t heap, want;
	} cases[] = {
	    {100 * mib, 10 * mib},  /* unchanged */
	    {104 * mib, 6 * mib},   /* grew out of the free memory */
	    {40 * mib, 70 * mib},   /* shrank: what it freed counts as free */
	    {110 * mib, 0},         /* used all of it */
	    {300 * mib, 0},         /* and more: never negative */
	    {200 * mib, 100 * mib}, /* shrank from its peak: 300 held */
	    {0, 300 * mib},         /* all freed: held until a sample says */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		f = 77;
		cr_expect_eq(mtshm_free_now(s, cases[i].heap, &h, &f, &absurd),
		             1);
		cr_expect_eq(f, cases[i].want, "heap %llu MiB: %llu",
		             (unsigned long long)(cases[i].heap / mib),
		             (unsigned long long)f);
		cr_expect_eq(absurd, 0);
	}
	/* A new sample replaces what was held: the allocator gave back all
	 * but 2 MiB (a negative heap at the sample counts as 0). */
	l->free_seq = 4;
	l->free_bytes = (int64_t)(2 * mib);
	l->free_heap = -(int64_t)mib;
	cr_expect_eq(mtshm_free_now(s, 0, &h, &f, &absurd), 1);
	cr_expect_eq(f, 2 * mib);
	cr_expect_eq(mtshm_free_now(s, mib, &h, &f, &absurd), 1);
	cr_expect_eq(f, mib);
	/* Being written: the last whole sample stands, with this heap. */
	l->free_seq = 5;
	l->free_bytes = 0;
	f = 77;
	cr_expect_eq(mtshm_free_now(s, 0, &h, &f, &absurd), 1);
	cr_expect_eq(f, 2 * mib);
	/* Near the limits, nothing overflows. */
	l->free_seq = 6;
	l->free_bytes = MTSHM_ABSURD_BYTES;
	l->free_heap = MTSHM_ABSURD_BYTES;
	cr_expect_eq(mtshm_free_now(s, (uint64_t)MTSHM_ABSURD_BYTES / 2, &h, &f,
	                            &absurd),
	             1);
	cr_expect_eq(f, 2 * (uint64_t)MTSHM_ABSURD_BYTES -
	                    (uint64_t)MTSHM_ABSURD_BYTES / 2);
	/* Being written before any sample was read whole: not read, the
	 * caller keeps its value. */
	struct mtshm_free_held fresh = {0};
	l->free_seq = 7;
	f = 77;
	cr_expect_eq(mtshm_free_now(s, 100 * mib, &fresh, &f, &absurd), 0);
	cr_expect_eq(f, 77);
	/* Absurd: negative, or beyond MTSHM_ABSURD_BYTES. */
	l->free_seq = 8;
	l->free_heap = 0;
	l->free_bytes = -1;
	cr_expect_eq(mtshm_free_now(s, 0, &h, &f, &absurd), 1);
	cr_expect_eq(absurd, 1);
	cr_expect_eq(f, 0);
	l->free_bytes = MTSHM_ABSURD_BYTES + 1;
	cr_expect_eq(mtshm_free_now(s, 0, &h, &f, &absurd), 1);
	cr_expect_eq(absurd, 1);
	l->free_bytes = 0;
	l->free_heap = MTSHM_ABSURD_BYTES + 1;
	cr_expect_eq(mtshm_free_now(s, 0, &h, &f, &absurd), 1);
	cr_expect_eq(absurd, 1);
}
