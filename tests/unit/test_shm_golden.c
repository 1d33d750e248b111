/*
 * test_shm_golden.c - every build must read the committed layout-2.0
 * images (tests/golden/header-v2.0.bin and table-v2.0.bin, written by
 * tests/golden/make_golden.c) and reject each corrupted variant of the
 * header with the one right error code.
 *
 * The images' values are repeated here on purpose: if mtshm.h moves a
 * field (and its _Static_asserts with it), these tests read the old bytes
 * through the new structs and fail. The byte-for-byte tests rebuild each
 * image from the offsets of the diagram in mtshm.h without any struct and
 * compare all of it, so the diagram, the structs and the images must all
 * agree.
 *
 * Every image handed to mtshm_validate() ends exactly where an inaccessible
 * page begins, so "never reads beyond size" is checked in every build, not
 * only under ASan: a read past the end is a SIGSEGV and the test fails.
 */
#define _GNU_SOURCE
#include "golden_image.h"
#include "mtshm.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HEADER_PATH MEMTALLY_GOLDEN_DIR "/header-v2.0.bin"
#define TABLE_PATH  MEMTALLY_GOLDEN_DIR "/table-v2.0.bin"

enum {
	G_SLOTS = 4,
	G_LANES = 4,
	G_STRIDE = G_LANES * MTSHM_LINE,
	G_HSIZE = MTSHM_HEADER_SIZE,   /* 4096 */
	G_TSIZE = G_SLOTS * G_STRIDE,  /* 2048 */
};

/* The images as read from disk. */
static unsigned char golden[G_HSIZE];
static unsigned char gtable[G_TSIZE];

static void load_golden(void)
{
	golden_load(HEADER_PATH, golden, G_HSIZE);
	golden_load(TABLE_PATH, gtable, G_TSIZE);
}

TestSuite(golden, .init = load_golden);

/*
 * A copy of src[0..n) placed so that byte n is the first byte of a
 * PROT_NONE page. The mapping is left to process exit: each Criterion test
 * is its own process.
 */
static unsigned char *guarded_copy(const void *src, size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	size_t body = (n + pg - 1) / pg * pg;
	unsigned char *map = mmap(NULL, body + pg, PROT_READ | PROT_WRITE,
	                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(map, MAP_FAILED);
	cr_assert_eq(mprotect(map + body, pg, PROT_NONE), 0);
	unsigned char *p = map + body - n;
	if (n)
		memcpy(p, src, n);
	return p;
}

/* A private, writable copy of the golden header. */
static unsigned char *golden_copy(void)
{
	return guarded_copy(golden, G_HSIZE);
}

static struct mtshm_header *hdr(unsigned char *img)
{
	return (struct mtshm_header *)img;
}

static void expect_code(int got, int want, const char *what)
{
	cr_expect_eq(got, want, "%s: got %d (%s), want %d (%s)", what, got,
	             mtshm_strerror(got), want, mtshm_strerror(want));
}

/* Little-endian writes at a byte offset, independent of any struct (the
 * reads: golden_le). */
static void put(unsigned char *p, size_t off, int width, uint64_t v)
{
	for (int i = 0; i < width; i++, v >>= 8)
		p[off + (size_t)i] = (unsigned char)v;
}

/* A private memfd holding src[0..n), sealed with `seals` (0: none). */
static int memfd_of(const void *src, size_t n, unsigned seals)
{
	int fd = memfd_create("golden", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, src, n), (ssize_t)n);
	if (seals)
		cr_assert_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__

/* The image is little-endian: a big-endian build must say exactly that. */
Test(golden, rejected_as_other_byte_order)
{
	expect_code(mtshm_validate(golden_copy(), G_HSIZE), MTSHM_EBYTEORDER,
	            "golden on a big-endian host");
}

#else

/* --- accepted, and read back as written ------------------------------ */

Test(golden, accepted)
{
	expect_code(mtshm_validate(golden_copy(), G_HSIZE), 0, "golden");
}

Test(golden, accepted_with_bytes_past_the_header)
{
	/* A mapping larger than the page (a reader that mapped more) is
	 * fine: only the header page is read. */
	unsigned char big[G_HSIZE + 2048] = {0};
	memcpy(big, golden, G_HSIZE);
	expect_code(mtshm_validate(guarded_copy(big, sizeof(big)), sizeof(big)),
	            0, "golden + 2048 zero bytes");
}

Test(golden, header_byte_for_byte)
{
	/* The whole page rebuilt from the diagram in mtshm.h: literal
	 * offsets, widths and values, zero everywhere else. */
	static const struct {
		size_t off;
		int width;
		uint64_t v;
	} f[] = {
	    {0, 8, MTSHM_MAGIC}, /* "MEMTALLY" */
	    {8, 2, 2},           /* version_major */
	    {10, 2, 0},          /* version_minor */
	    {12, 2, 0},          /* compat_minor */
	    {16, 4, 4096},       /* header_size */
	    {20, 4, 0},          /* reserved_off */
	    {24, 4, 512},        /* slot_stride */
	    {28, 4, 4},          /* slot_count */
	    {32, 4, 4},          /* lane_count */
	    {36, 4, 128},        /* line_size */
	    {40, 8, 2048},       /* table_size */
	    {48, 8, UINT64_C(0x0123456789abcdef)}, /* generation */
	    {56, 4, 4242},                         /* server_pid */
	    {60, 4, 1000},                         /* server_uid */
	    {64, 8, UINT64_C(1700000000123456789)}, /* created_ns */
	    {72, 8, 65536},                         /* threshold */
	    {128 + 0, 8, 6},                        /* fleet.seq */
	    {128 + 8, 8, 754996},                   /* fleet.bytes */
	    {128 + 16, 8, 800000},                  /* fleet.peak */
	    {128 + 24, 8, 800000},                  /* fleet.limit */
	    {128 + 32, 8, 4096},                    /* fleet.reserved */
	    {128 + 40, 8, 7 * 65536},               /* fleet.error_bytes */
	    {128 + 48, 8, UINT64_C(123456789000)},  /* fleet.heartbeat_ns */
	    {128 + 56, 8, 3},                       /* fleet.ticks */
	    {128 + 64, 4, MTSHM_STATE_HIGH},        /* fleet.state */
	    {128 + 68, 4, 3},                       /* fleet.processes */
	    {128 + 72, 4, 1},                       /* fleet.unregistered */
	};
	unsigned char want[G_HSIZE] = {0};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		put(want, f[i].off, f[i].width, f[i].v);
	cr_assert_eq(memcmp(want, "MEMTALLY", 8), 0, "magic bytes at 0");
	for (size_t off = 0; off < G_HSIZE; off++)
		cr_expect_eq(golden[off], want[off],
		             "header byte %zu: 0x%02x, want 0x%02x", off,
		             golden[off], want[off]);
	/* Reserved words are zero: reserved0 (14..15), reserved1 (80..127),
	 * the fleet's spares (128+76..255) and reserved2 (256..4095). */
	cr_expect_eq(golden_le(golden, 14, 2), 0, "reserved0");
	for (size_t off = 80; off < 128; off++)
		cr_expect_eq(golden[off], 0, "reserved1 byte %zu", off);
	for (size_t off = 128 + 76; off < 4096; off++)
		cr_expect_eq(golden[off], 0, "spare byte %zu", off);
}

Test(golden, table_byte_for_byte)
{
	/* Slot i at i * 512: identity in line 0, lane k at 128k + 64. */
	static const struct {
		size_t off;
		int width;
		uint64_t v;
	} f[] = {
	    /* slot 0 */
	    {0 + 0, 4, 1234},                   /* pid */
	    {0 + 4, 4, 1000},                   /* uid */
	    {0 + 8, 8, 7},                      /* generation */
	    {0 + 16, 8, 987654},                /* start_time */
	    {0 + 24, 8, UINT64_C(1) << 30},     /* limit */
	    {0 + 32, 8, 760000},                /* peak */
	    {0 + 44, 4, 1},                     /* group */
	    {0 + 48, 4, 3},                     /* threads */
	    {0 + 52, 4, 2},                     /* lanes_used */
	    {0 + 56, 8, 4096},                  /* overflow */
	    {0 + 64 + 0, 4, 1234},              /* lane 0 owner */
	    {0 + 64 + 8, 8, 1000000},           /* lane 0 bytes */
	    {0 + 64 + 16, 8, 10},               /* lane 0 flushes */
	    {0 + 192 + 0, 4, 1240},             /* lane 1 owner */
	    {0 + 192 + 8, 8, (uint64_t)-250000}, /* lane 1 bytes */
	    {0 + 192 + 16, 8, 5},               /* lane 1 flushes */
	    {0 + 320 + 8, 8, 777},              /* lane 2 bytes (stale) */
	    {0 + 320 + 16, 8, 99},              /* lane 2 flushes */
	    /* slot 1: free, all zero; slot 2 at 1024 */
	    {1024 + 0, 4, 5678},
	    {1024 + 4, 4, 1000},
	    {1024 + 8, 8, 2},
	    {1024 + 16, 8, 123},
	    {1024 + 24, 8, 500},
	    {1024 + 32, 8, 1000},
	    {1024 + 40, 4, MTSHM_SLOT_OVER_LIMIT},
	    {1024 + 44, 4, 2},
	    {1024 + 48, 4, 4},
	    {1024 + 52, 4, 4},
	    {1024 + 56, 8, (uint64_t)-100},
	    /* slot 3 at 1536 */
	    {1536 + 0, 4, 9999},
	    {1536 + 4, 4, 1000},
	    {1536 + 8, 8, 1},
	    {1536 + 16, 8, 5},
	    {1536 + 40, 4, MTSHM_SLOT_CORRUPT},
	    {1536 + 44, 4, 1},
	    {1536 + 48, 4, 1},
	    {1536 + 52, 4, 1},
	    {1536 + 56, 8, 5},
	    {1536 + 64 + 0, 4, 9999},
	    {1536 + 64 + 8, 8, UINT64_C(1) << 60},
	    {1536 + 64 + 16, 8, 1},
	};
	unsigned char want[G_TSIZE] = {0};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		put(want, f[i].off, f[i].width, f[i].v);
	for (uint32_t k = 0; k < 4; k++) { /* slot 2's lanes */
		put(want, 1024 + 128 * k + 64 + 0, 4, 5678 + k);
		put(want, 1024 + 128 * k + 64 + 8, 8, 100 * (k + 1));
		put(want, 1024 + 128 * k + 64 + 16, 8, k + 1);
	}
	for (size_t off = 0; off < G_TSIZE; off++)
		cr_expect_eq(gtable[off], want[off],
		             "table byte %zu: 0x%02x, want 0x%02x", off,
		             gtable[off], want[off]);
}

Test(golden, struct_offsets_match_the_diagram)
{
	/* The same offsets through the structs, so a struct change that kept
	 * its _Static_asserts in step still fails here. */
	cr_expect_eq(offsetof(struct mtshm_header, magic), 0);
	cr_expect_eq(offsetof(struct mtshm_header, version_major), 8);
	cr_expect_eq(offsetof(struct mtshm_header, version_minor), 10);
	cr_expect_eq(offsetof(struct mtshm_header, compat_minor), 12);
	cr_expect_eq(offsetof(struct mtshm_header, reserved0), 14);
	cr_expect_eq(offsetof(struct mtshm_header, header_size), 16);
	cr_expect_eq(offsetof(struct mtshm_header, reserved_off), 20);
	cr_expect_eq(offsetof(struct mtshm_header, slot_stride), 24);
	cr_expect_eq(offsetof(struct mtshm_header, slot_count), 28);
	cr_expect_eq(offsetof(struct mtshm_header, lane_count), 32);
	cr_expect_eq(offsetof(struct mtshm_header, line_size), 36);
	cr_expect_eq(offsetof(struct mtshm_header, table_size), 40);
	cr_expect_eq(offsetof(struct mtshm_header, generation), 48);
	cr_expect_eq(offsetof(struct mtshm_header, server_pid), 56);
	cr_expect_eq(offsetof(struct mtshm_header, server_uid), 60);
	cr_expect_eq(offsetof(struct mtshm_header, created_ns), 64);
	cr_expect_eq(offsetof(struct mtshm_header, threshold), 72);
	cr_expect_eq(offsetof(struct mtshm_header, reserved1), 80);
	cr_expect_eq(offsetof(struct mtshm_header, fleet), 128);
	cr_expect_eq(offsetof(struct mtshm_header, reserved2), 256);
	cr_expect_eq(sizeof(struct mtshm_header), 4096);
	cr_expect_eq(offsetof(struct mtshm_fleet, peak), 16);
	cr_expect_eq(offsetof(struct mtshm_fleet, reserved), 32);
	cr_expect_eq(offsetof(struct mtshm_fleet, error_bytes), 40);
	cr_expect_eq(offsetof(struct mtshm_fleet, ticks), 56);
	cr_expect_eq(offsetof(struct mtshm_fleet, processes), 68);
	cr_expect_eq(offsetof(struct mtshm_slot_id, uid), 4);
	cr_expect_eq(offsetof(struct mtshm_slot_id, group), 44);
	cr_expect_eq(offsetof(struct mtshm_slot_id, lanes_used), 52);
	cr_expect_eq(offsetof(struct mtshm_lane, owner), 0);
	cr_expect_eq(MTSHM_MAGIC,
	             golden_le((const unsigned char *)"MEMTALLY", 0, 8));
}

Test(golden, header_fields)
{
	unsigned char *img = golden_copy();
	const struct mtshm_header *h = hdr(img);
	cr_expect_eq(h->magic, MTSHM_MAGIC);
	cr_expect_eq(h->version_major, 2);
	cr_expect_eq(h->version_minor, 0);
	cr_expect_eq(h->compat_minor, 0);
	cr_expect_eq(h->header_size, MTSHM_HEADER_SIZE);
	cr_expect_eq(h->reserved_off, 0);
	cr_expect_eq(h->slot_stride, G_STRIDE);
	cr_expect_eq(h->slot_count, G_SLOTS);
	cr_expect_eq(h->lane_count, G_LANES);
	cr_expect_eq(h->line_size, MTSHM_LINE);
	cr_expect_eq(h->table_size, G_TSIZE);
	cr_expect_eq(h->generation, UINT64_C(0x0123456789abcdef));
	cr_expect_eq(h->server_pid, 4242);
	cr_expect_eq(h->server_uid, 1000);
	cr_expect_eq(h->created_ns, UINT64_C(1700000000123456789));
	cr_expect_eq(h->threshold, 65536);
}

Test(golden, layout_copied_from_the_header)
{
	struct mtshm_layout l;
	memset(&l, 0xa5, sizeof(l));
	expect_code(mtshm_layout_read(golden_copy(), G_HSIZE, &l), 0, "layout");
	cr_expect_eq(l.slot_count, G_SLOTS);
	cr_expect_eq(l.lane_count, G_LANES);
	cr_expect_eq(l.slot_stride, G_STRIDE);
	cr_expect_eq(l.table_size, G_TSIZE);
	cr_expect_eq(l.threshold, 65536);
	cr_expect_eq(l.generation, UINT64_C(0x0123456789abcdef));
}

Test(golden, layout_of_a_refused_header_is_zeroed)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_major = 3;
	struct mtshm_layout l, zero;
	memset(&l, 0xa5, sizeof(l));
	memset(&zero, 0, sizeof(zero));
	expect_code(mtshm_layout_read(img, G_HSIZE, &l), MTSHM_EVERSION,
	            "major 3");
	cr_expect_eq(memcmp(&l, &zero, sizeof(l)), 0, "layout not zeroed");
	memset(&l, 0xa5, sizeof(l));
	expect_code(mtshm_layout_read(guarded_copy(golden, 100), 100, &l),
	            MTSHM_ETRUNCATED, "100 bytes");
	cr_expect_eq(memcmp(&l, &zero, sizeof(l)), 0, "layout not zeroed");
}

Test(golden, fleet_snapshot)
{
	unsigned char *img = golden_copy();
	struct mtshm_fleet f;
	memset(&f, 0xa5, sizeof(f));
	cr_expect_eq(mtshm_fleet_read(hdr(img), &f), 0);
	cr_expect_eq(f.seq, 6);
	cr_expect_eq(f.bytes, 754996);
	cr_expect_eq(f.peak, 800000);
	cr_expect_eq(f.limit, 800000);
	cr_expect_eq(f.reserved, 4096);
	cr_expect_eq(f.error_bytes, 7 * 65536);
	cr_expect_eq(f.heartbeat_ns, UINT64_C(123456789000));
	cr_expect_eq(f.ticks, 3);
	cr_expect_eq(f.state, MTSHM_STATE_HIGH);
	cr_expect_eq(f.processes, 3);
	cr_expect_eq(f.unregistered, 1);
}

/* Expected read-back of one slot of the table image. */
struct want_slot {
	uint32_t pid, uid, flags, group, threads, lanes_used;
	uint64_t generation, start_time, limit, peak;
	int64_t overflow, sum;
	uint64_t flushes;
	int absurd;
};

static const struct want_slot want[G_SLOTS] = {
    {.pid = 1234,
     .uid = 1000,
     .group = 1,
     .threads = 3,
     .lanes_used = 2,
     .generation = 7,
     .start_time = 987654,
     .limit = UINT64_C(1) << 30,
     .peak = 760000,
     .overflow = 4096,
     /* 4096 + 1000000 - 250000; lane 2's stale 777 is not summed. */
     .sum = 754096,
     .flushes = 15},
    {0},
    {.pid = 5678,
     .uid = 1000,
     .flags = MTSHM_SLOT_OVER_LIMIT,
     .group = 2,
     .threads = 4,
     .lanes_used = 4,
     .generation = 2,
     .start_time = 123,
     .limit = 500,
     .peak = 1000,
     .overflow = -100,
     .sum = -100 + 100 + 200 + 300 + 400,
     .flushes = 1 + 2 + 3 + 4},
    {.pid = 9999,
     .uid = 1000,
     .flags = MTSHM_SLOT_CORRUPT,
     .group = 1,
     .threads = 1,
     .lanes_used = 1,
     .generation = 1,
     .start_time = 5,
     .overflow = 5,
     /* 2^60 + 5: a total beyond MTSHM_ABSURD_BYTES, flagged. */
     .sum = (INT64_C(1) << 60) + 5,
     .flushes = 1,
     .absurd = 1},
};

/* Check every slot of a table against want[], addressing slots only
 * through the layout read from `header`. */
static void check_slots(const unsigned char *header, unsigned char *table)
{
	struct mtshm_layout l;
	cr_assert_eq(mtshm_layout_read(header, G_HSIZE, &l), 0);
	const struct mtshm_header *h = (const struct mtshm_header *)header;
	int64_t fleet = 0;
	for (uint32_t i = 0; i < G_SLOTS; i++) {
		struct mtshm_slot_id *s = mtshm_slot(&l, table, i);
		const struct want_slot *w = &want[i];
		cr_assert_eq((unsigned char *)s,
		             table + (size_t)i * h->slot_stride);
		cr_expect_eq(s->pid, w->pid, "slot %u pid", i);
		cr_expect_eq(s->uid, w->uid, "slot %u uid", i);
		cr_expect_eq(s->generation, w->generation, "slot %u gen", i);
		cr_expect_eq(s->start_time, w->start_time, "slot %u st", i);
		cr_expect_eq(s->limit, w->limit, "slot %u limit", i);
		cr_expect_eq(s->peak, w->peak, "slot %u peak", i);
		cr_expect_eq(s->flags, w->flags, "slot %u flags", i);
		cr_expect_eq(s->group, w->group, "slot %u group", i);
		cr_expect_eq(s->threads, w->threads, "slot %u threads", i);
		cr_expect_eq(s->lanes_used, w->lanes_used, "slot %u lanes", i);
		cr_expect_eq(s->overflow, w->overflow, "slot %u overflow", i);

		uint64_t flushes = 12345;
		int absurd = -1;
		int64_t sum = mtshm_slot_sum(s, l.lane_count, &flushes, &absurd);
		cr_expect_eq(absurd, w->absurd, "slot %u absurd", i);
		if (!absurd)
			cr_expect_eq(sum, w->sum, "slot %u sum %lld", i,
			             (long long)sum);
		cr_expect_eq(flushes, w->flushes, "slot %u flushes %llu", i,
		             (unsigned long long)flushes);
		if (!absurd)
			fleet += sum;
	}
	cr_expect_eq(fleet, (int64_t)h->fleet.bytes,
	             "the image's fleet total is the sum of its sane slots");
}

Test(golden, slots_through_the_layout)
{
	unsigned char *table = guarded_copy(gtable, G_TSIZE);
	check_slots(golden, table);

	/* Lane addressing: lane k of slot i is at 128k + 64 in the slot. */
	struct mtshm_layout l;
	cr_assert_eq(mtshm_layout_read(golden, G_HSIZE, &l), 0);
	struct mtshm_slot_id *s2 = mtshm_slot(&l, table, 2);
	for (uint32_t k = 0; k < G_LANES; k++) {
		struct mtshm_lane *ln = mtshm_lane(s2, k);
		cr_expect_eq((unsigned char *)ln, table + 2 * 512 + k * 128 + 64);
		cr_expect_eq(ln->owner, 5678 + k);
		cr_expect_eq(ln->bytes, 100 * (int64_t)(k + 1));
	}
}

Test(golden, absurd_judged_on_the_total_only)
{
	/* One lane far up, another far down (a thread that frees what
	 * another allocated): each beyond 2^50, the total sane and exact. */
	unsigned char *table = guarded_copy(gtable, G_TSIZE);
	struct mtshm_layout l;
	cr_assert_eq(mtshm_layout_read(golden, G_HSIZE, &l), 0);
	struct mtshm_slot_id *s = mtshm_slot(&l, table, 0);
	mtshm_lane(s, 0)->bytes = INT64_C(1) << 62;
	mtshm_lane(s, 1)->bytes = -(INT64_C(1) << 62) + 1000;
	uint64_t flushes;
	int absurd = -1;
	cr_expect_eq(mtshm_slot_sum(s, l.lane_count, &flushes, &absurd),
	             4096 + 1000);
	cr_expect_eq(absurd, 0, "sane total flagged");
	/* Lanes summed modulo 2^64: two lanes at INT64_MAX wrap, and the
	 * total read as signed is still the exact one. */
	mtshm_lane(s, 0)->bytes = INT64_MAX;
	mtshm_lane(s, 1)->bytes = INT64_MIN + 10;
	cr_expect_eq(mtshm_slot_sum(s, l.lane_count, &flushes, &absurd),
	             4096 + 9);
	cr_expect_eq(absurd, 0);
	/* The total just past the bound, either sign. */
	mtshm_lane(s, 0)->bytes = MTSHM_ABSURD_BYTES - 4096 + 1;
	mtshm_lane(s, 1)->bytes = 0;
	mtshm_slot_sum(s, l.lane_count, &flushes, &absurd);
	cr_expect_eq(absurd, 1, "total 2^50 + 1 not flagged");
	mtshm_lane(s, 0)->bytes = -MTSHM_ABSURD_BYTES - 4096 - 1;
	mtshm_slot_sum(s, l.lane_count, &flushes, &absurd);
	cr_expect_eq(absurd, 1, "total -2^50 - 1 not flagged");
	mtshm_lane(s, 0)->bytes = MTSHM_ABSURD_BYTES - 4096;
	mtshm_slot_sum(s, l.lane_count, &flushes, &absurd);
	cr_expect_eq(absurd, 0, "total 2^50 flagged");
}

Test(golden, lanes_used_beyond_lane_count_is_clamped)
{
	unsigned char *table = guarded_copy(gtable, G_TSIZE);
	struct mtshm_layout l;
	cr_assert_eq(mtshm_layout_read(golden, G_HSIZE, &l), 0);
	struct mtshm_slot_id *s = mtshm_slot(&l, table, 2);
	s->lanes_used = UINT32_MAX; /* a worker's garbage */
	uint64_t flushes;
	int absurd;
	cr_expect_eq(mtshm_slot_sum(s, l.lane_count, &flushes, &absurd), 900);
	cr_expect_eq(flushes, 10);
	/* The last slot of the table too: no read past its end. */
	s = mtshm_slot(&l, table, G_SLOTS - 1);
	s->lanes_used = UINT32_MAX;
	mtshm_slot_sum(s, l.lane_count, &flushes, &absurd);
}

/* --- the images as the sealed objects a worker maps --------------------- */

Test(golden, sealed_header_object_maps_read_only)
{
	int fd = memfd_of(golden, G_HSIZE, MTSHM_SEALS_HEADER);
	struct mtshm_map m;
	expect_code(mtshm_map_fd(fd, MTSHM_SEALS_HEADER, G_HSIZE, &m), 0,
	            "sealed header");
	cr_assert_not_null(m.hdr);
	cr_expect_eq(m.size, G_HSIZE);
	cr_expect_eq(m.fd, -1, "the descriptor is the caller's");
	cr_expect_eq(memcmp(m.base, golden, G_HSIZE), 0);
	/* Sealed against new writable mappings, whoever asks. */
	cr_expect_eq(mmap(NULL, G_HSIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
	                  0),
	             MAP_FAILED);
	mtshm_close(&m);
	close(fd);
}

Test(golden, sealed_table_object_maps_and_sums)
{
	int fd = memfd_of(gtable, G_TSIZE, MTSHM_SEALS_TABLE);
	struct mtshm_map m;
	expect_code(mtshm_map_fd(fd, MTSHM_SEALS_TABLE, G_TSIZE, &m), 0,
	            "sealed table");
	cr_expect_null(m.hdr, "a table is not a header");
	check_slots(golden, m.base);
	mtshm_close(&m);
	/* Of another size than the header announces: refused. */
	expect_code(mtshm_map_fd(fd, MTSHM_SEALS_TABLE, G_TSIZE * 2, &m),
	            MTSHM_ETRUNCATED, "table of the wrong size");
	close(fd);
}

Test(golden, unsealed_objects_refused)
{
	int fd = memfd_of(golden, G_HSIZE, 0);
	struct mtshm_map m;
	expect_code(mtshm_map_fd(fd, MTSHM_SEALS_HEADER, G_HSIZE, &m),
	            MTSHM_EUNSEALED, "unsealed header");
	close(fd);
	/* Sealed against resizing but still writable: not a header. */
	fd = memfd_of(golden, G_HSIZE, MTSHM_SEALS_TABLE);
	expect_code(mtshm_map_fd(fd, MTSHM_SEALS_HEADER, G_HSIZE, &m),
	            MTSHM_EUNSEALED, "header without F_SEAL_FUTURE_WRITE");
	close(fd);
	fd = memfd_of(gtable, G_TSIZE, F_SEAL_SHRINK);
	expect_code(mtshm_map_fd(fd, MTSHM_SEALS_TABLE, G_TSIZE, &m),
	            MTSHM_EUNSEALED, "table that may grow");
	close(fd);
}

/* --- compatible future minors ---------------------------------------- */

Test(golden, future_minor_compat_0_accepted)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_minor = MTSHM_VERSION_MINOR + 7;
	hdr(img)->compat_minor = 0;
	expect_code(mtshm_validate(img, G_HSIZE), 0, "2.7 compat 0");
}

Test(golden, future_minor_compat_ours_accepted)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_minor = MTSHM_VERSION_MINOR + 1;
	hdr(img)->compat_minor = MTSHM_VERSION_MINOR;
	expect_code(mtshm_validate(img, G_HSIZE), 0, "compat = our minor");
}

Test(golden, future_minor_wider_stride_read_through_the_layout)
{
	/* A later minor that added a line per slot: stride 640 for 4 lanes.
	 * Readers find slots through the layout's stride, never sizeof. */
	enum { ST = G_STRIDE + MTSHM_LINE, SZ = G_SLOTS * ST };
	unsigned char *img = golden_copy();
	struct mtshm_header *h = hdr(img);
	h->version_minor = 2;
	h->slot_stride = ST;
	h->table_size = SZ;
	expect_code(mtshm_validate(img, G_HSIZE), 0, "2.2 with stride 640");
	static unsigned char wide[SZ];
	for (size_t i = 0; i < G_SLOTS; i++)
		memcpy(wide + i * ST, gtable + i * G_STRIDE, G_STRIDE);
	check_slots(img, guarded_copy(wide, SZ));
}

/* --- rejected, each with its own code -------------------------------- */

Test(golden, bad_magic)
{
	unsigned char *img = golden_copy();
	img[7] = 'X'; /* "MEMTALLX" */
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_EBADMAGIC, "MEMTALLX");
}

Test(golden, zero_magic_of_a_header_still_being_created)
{
	unsigned char *img = golden_copy();
	hdr(img)->magic = 0;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_EBADMAGIC, "magic 0");
}

Test(golden, byte_swapped_magic)
{
	unsigned char *img = golden_copy();
	for (int i = 0; i < 4; i++) {
		unsigned char t = img[i];
		img[i] = img[7 - i];
		img[7 - i] = t;
	}
	cr_assert_eq(memcmp(img, "YLLATMEM", 8), 0);
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_EBYTEORDER,
	            "byte-swapped magic");
}

Test(golden, future_major)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_major = 3;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_EVERSION, "major 3");
}

Test(golden, older_major)
{
	/* A 1.x reader's header (the slots followed it in one object):
	 * tests/unit/test_shm_golden_v1.c refuses the real 1.x images. */
	unsigned char *img = golden_copy();
	hdr(img)->version_major = 1;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_EVERSION, "major 1");
}

Test(golden, major_zero)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_major = 0;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_EVERSION, "major 0");
}

Test(golden, compat_minor_newer_than_ours)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_minor = MTSHM_VERSION_MINOR + 1;
	hdr(img)->compat_minor = MTSHM_VERSION_MINOR + 1;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_EVERSION,
	            "compat_minor = our minor + 1");
}

Test(golden, shorter_than_the_header)
{
	/* As segment.c defines it: fewer than 8 bytes cannot even show a
	 * magic (EBADMAGIC); a right magic in a short object is a truncated
	 * header; anything else is not a header at all. */
	expect_code(mtshm_validate(guarded_copy(golden, 0), 0), MTSHM_EBADMAGIC,
	            "0 bytes");
	expect_code(mtshm_validate(guarded_copy(golden, 4), 4), MTSHM_EBADMAGIC,
	            "4 bytes");
	expect_code(mtshm_validate(guarded_copy(golden, 8), 8),
	            MTSHM_ETRUNCATED, "the magic alone");
	expect_code(mtshm_validate(guarded_copy(golden, 256), 256),
	            MTSHM_ETRUNCATED, "header fields and fleet, no reserve");
	expect_code(mtshm_validate(guarded_copy(golden, 4095), 4095),
	            MTSHM_ETRUNCATED, "4095 bytes");
	unsigned char junk[4088];
	memset(junk, 0x5a, sizeof(junk));
	expect_code(mtshm_validate(guarded_copy(junk, 4088), 4088),
	            MTSHM_EBADMAGIC, "4088 bytes of junk");
}

/*
 * Layout checks. Each variant is built so that only the check under test
 * can refuse it (table_size kept equal to slot_count x slot_stride): with
 * that check gone the header would be accepted, so the test fails.
 */

static unsigned char *with_geometry(uint32_t stride, uint32_t count,
                                    uint32_t lanes)
{
	unsigned char *img = golden_copy();
	struct mtshm_header *h = hdr(img);
	h->slot_stride = stride;
	h->slot_count = count;
	h->lane_count = lanes;
	h->table_size = (uint64_t)count * stride;
	return img;
}

Test(golden, stride_not_a_multiple_of_the_line)
{
	unsigned char *img = with_geometry(G_STRIDE + 8, G_SLOTS, G_LANES);
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT, "stride 520");
}

Test(golden, stride_smaller_than_its_lanes)
{
	/* 3 lines, 4 lanes. */
	unsigned char *img =
	    with_geometry(G_STRIDE - MTSHM_LINE, G_SLOTS, G_LANES);
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT, "stride 384");
}

Test(golden, stride_zero)
{
	unsigned char *img = with_geometry(0, G_SLOTS, G_LANES);
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT, "stride 0");
}

Test(golden, lane_count_zero)
{
	unsigned char *img = with_geometry(G_STRIDE, G_SLOTS, 0);
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT, "0 lanes");
}

Test(golden, lane_count_over_max)
{
	unsigned char *img =
	    with_geometry((MTSHM_MAX_LANES + 1) * MTSHM_LINE, 1,
	                  MTSHM_MAX_LANES + 1);
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT, "65 lanes");
}

Test(golden, header_size_not_a_page)
{
	unsigned char *img = golden_copy();
	hdr(img)->header_size = 2048;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT,
	            "header_size 2048");
	/* 1.x let a later minor grow the header; 2.0 keeps it one page. */
	hdr(img)->header_size = 8192;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT,
	            "header_size 8192");
}

Test(golden, line_size_not_128)
{
	unsigned char *img = golden_copy();
	hdr(img)->line_size = 64;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT, "line 64");
}

Test(golden, slot_count_zero)
{
	unsigned char *img = with_geometry(G_STRIDE, 0, G_LANES);
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT, "0 slots");
}

Test(golden, slot_count_over_max)
{
	unsigned char *img =
	    with_geometry(G_STRIDE, MTSHM_MAX_SLOTS + 1, G_LANES);
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT,
	            "MTSHM_MAX_SLOTS + 1 slots");
}

Test(golden, table_size_not_its_slots)
{
	/* A reader sizes (and checks) the table object by table_size: it
	 * must be exactly slot_count x slot_stride, neither less (slots
	 * beyond the object) nor more. */
	unsigned char *img = golden_copy();
	hdr(img)->table_size = G_TSIZE - G_STRIDE;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT,
	            "table_size 1536");
	hdr(img)->table_size = G_TSIZE + 1;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT,
	            "table_size 2049");
	hdr(img)->table_size = UINT64_MAX;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT,
	            "table_size 2^64 - 1");
	hdr(img)->table_size = 0;
	expect_code(mtshm_validate(img, G_HSIZE), MTSHM_ELAYOUT,
	            "table_size 0");
}

#endif /* little-endian */
