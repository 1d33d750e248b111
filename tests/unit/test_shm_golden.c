/*
 * test_shm_golden.c - every build must read the committed layout-1.0 image
 * (tests/golden/segment-v1.0.bin, written by tests/golden/make_golden.c)
 * and reject each corrupted variant of it with the one right error code.
 *
 * The image's values are repeated here on purpose: if mtshm.h moves a field
 * (and its _Static_asserts with it), these tests read the old bytes through
 * the new structs and fail. The raw-offset test reads the bytes at the
 * offsets of the diagram in mtshm.h without any struct, so the diagram, the
 * structs and the image must all agree.
 *
 * Every image handed to mtshm_validate() ends exactly where an inaccessible
 * page begins, so "never reads beyond size" is checked in every build, not
 * only under ASan: a read past the end is a SIGSEGV and the test fails.
 */
#define _GNU_SOURCE
#include "mtshm.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GOLDEN_PATH MEMTALLY_GOLDEN_DIR "/segment-v1.0.bin"

enum {
	G_SLOTS = 4,
	G_LANES = 4,
	G_STRIDE = G_LANES * MTSHM_LINE,
	G_SIZE = MTSHM_HEADER_SIZE + G_SLOTS * G_STRIDE, /* 6144 */
};

/* The image as read from disk. */
static unsigned char golden[G_SIZE];

static void load_golden(void)
{
	FILE *f = fopen(GOLDEN_PATH, "rb");
	cr_assert_not_null(f, "cannot open %s", GOLDEN_PATH);
	size_t n = fread(golden, 1, sizeof(golden), f);
	int extra = fgetc(f);
	fclose(f);
	cr_assert_eq(n, (size_t)G_SIZE, "%s: %zu bytes, want %d", GOLDEN_PATH,
	             n, G_SIZE);
	cr_assert_eq(extra, EOF, "%s: longer than %d bytes", GOLDEN_PATH,
	             G_SIZE);
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

/* A private, writable copy of the whole golden image. */
static unsigned char *golden_copy(void)
{
	return guarded_copy(golden, G_SIZE);
}

static struct mtshm_header *hdr(unsigned char *img)
{
	return (struct mtshm_header *)img;
}

static struct mtshm_map map_of(unsigned char *img, size_t size)
{
	struct mtshm_map m = {.base = img, .size = size, .hdr = hdr(img)};
	return m;
}

static void expect_code(int got, int want, const char *what)
{
	cr_expect_eq(got, want, "%s: got %d (%s), want %d (%s)", what, got,
	             mtshm_strerror(got), want, mtshm_strerror(want));
}

/* Little-endian reads at a byte offset, independent of any struct. */
static uint64_t le(const unsigned char *p, size_t off, int width)
{
	uint64_t v = 0;
	for (int i = width - 1; i >= 0; i--)
		v = v << 8 | p[off + (size_t)i];
	return v;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__

/* The image is little-endian: a big-endian build must say exactly that. */
Test(golden, rejected_as_other_byte_order)
{
	expect_code(mtshm_validate(golden_copy(), G_SIZE), MTSHM_EBYTEORDER,
	            "golden on a big-endian host");
}

#else

/* --- accepted, and read back as written ------------------------------ */

Test(golden, accepted)
{
	expect_code(mtshm_validate(golden_copy(), G_SIZE), 0, "golden");
}

Test(golden, accepted_with_bytes_past_segment_size)
{
	/* An object larger than declared (say, rounded up to a page) is
	 * fine: only the declared slots must fit. */
	unsigned char big[G_SIZE + 2048] = {0};
	memcpy(big, golden, G_SIZE);
	expect_code(mtshm_validate(guarded_copy(big, sizeof(big)), sizeof(big)),
	            0, "golden + 2048 zero bytes");
}

Test(golden, on_disk_offsets_match_the_diagram)
{
	/* Literal offsets from the diagram in mtshm.h, read byte by byte. */
	const unsigned char *g = golden;
	cr_assert_eq(memcmp(g, "MEMTALLY", 8), 0, "magic bytes at 0");
	cr_expect_eq(le(g, 8, 2), 1, "version_major at 8");
	cr_expect_eq(le(g, 10, 2), 0, "version_minor at 10");
	cr_expect_eq(le(g, 12, 2), 0, "compat_minor at 12");
	cr_expect_eq(le(g, 16, 4), 4096, "header_size at 16");
	cr_expect_eq(le(g, 20, 4), 4096, "slot_offset at 20");
	cr_expect_eq(le(g, 24, 4), 512, "slot_stride at 24");
	cr_expect_eq(le(g, 28, 4), 4, "slot_count at 28");
	cr_expect_eq(le(g, 32, 4), 4, "lane_count at 32");
	cr_expect_eq(le(g, 36, 4), 128, "line_size at 36");
	cr_expect_eq(le(g, 40, 8), 6144, "segment_size at 40");
	cr_expect_eq(le(g, 48, 8), UINT64_C(0x0123456789abcdef),
	             "generation at 48");
	cr_expect_eq(le(g, 56, 4), 4242, "server_pid at 56");
	cr_expect_eq(le(g, 60, 4), 1000, "server_uid at 60");
	cr_expect_eq(le(g, 64, 8), UINT64_C(1700000000123456789),
	             "created_ns at 64");
	cr_expect_eq(le(g, 72, 8), 65536, "threshold at 72");

	/* fleet at 128 */
	cr_expect_eq(le(g, 128 + 0, 8), 6, "fleet.seq");
	cr_expect_eq(le(g, 128 + 8, 8), 754996, "fleet.bytes");
	cr_expect_eq(le(g, 128 + 16, 8), 800000, "fleet.peak");
	cr_expect_eq(le(g, 128 + 24, 8), 800000, "fleet.limit");
	cr_expect_eq(le(g, 128 + 32, 8), 4096, "fleet.reserved");
	cr_expect_eq(le(g, 128 + 40, 8), 7 * 65536, "fleet.error_bytes");
	cr_expect_eq(le(g, 128 + 48, 8), UINT64_C(123456789000),
	             "fleet.heartbeat_ns");
	cr_expect_eq(le(g, 128 + 56, 8), 3, "fleet.ticks");
	cr_expect_eq(le(g, 128 + 64, 4), MTSHM_STATE_HIGH, "fleet.state");
	cr_expect_eq(le(g, 128 + 68, 4), 3, "fleet.processes");
	cr_expect_eq(le(g, 128 + 72, 4), 1, "fleet.unregistered");

	/* Reserved words are zero: reserved1 (80..127), the fleet's spares
	 * (128+76..255) and reserved2 (256..4095). */
	for (size_t off = 80; off < 128; off++)
		cr_expect_eq(g[off], 0, "reserved1 byte %zu", off);
	for (size_t off = 128 + 76; off < 256; off++)
		cr_expect_eq(g[off], 0, "fleet spare byte %zu", off);
	for (size_t off = 256; off < 4096; off++)
		cr_expect_eq(g[off], 0, "reserved2 byte %zu", off);

	/* Slot 0 at 4096: identity in line 0, lane k at 4096 + 128k + 64. */
	cr_expect_eq(le(g, 4096 + 0, 4), 1234, "slot0.pid");
	cr_expect_eq(le(g, 4096 + 8, 8), 7, "slot0.generation");
	cr_expect_eq(le(g, 4096 + 16, 8), 987654, "slot0.start_time");
	cr_expect_eq(le(g, 4096 + 24, 8), UINT64_C(1) << 30, "slot0.limit");
	cr_expect_eq(le(g, 4096 + 32, 8), 760000, "slot0.peak");
	cr_expect_eq(le(g, 4096 + 44, 4), 1, "slot0.group");
	cr_expect_eq(le(g, 4096 + 48, 4), 3, "slot0.threads");
	cr_expect_eq(le(g, 4096 + 52, 4), 2, "slot0.lanes_used");
	cr_expect_eq(le(g, 4096 + 56, 8), 4096, "slot0.overflow");
	cr_expect_eq(le(g, 4096 + 64 + 0, 4), 1234, "slot0.lane0.owner");
	cr_expect_eq(le(g, 4096 + 64 + 8, 8), 1000000, "slot0.lane0.bytes");
	cr_expect_eq(le(g, 4096 + 64 + 16, 8), 10, "slot0.lane0.flushes");
	cr_expect_eq((int64_t)le(g, 4096 + 128 + 64 + 8, 8), -250000,
	             "slot0.lane1.bytes");
	/* Slot 2 at 4096 + 2 * 512, its lane 3 at + 3 * 128 + 64. */
	cr_expect_eq(le(g, 5120 + 0, 4), 5678, "slot2.pid");
	cr_expect_eq(le(g, 5120 + 40, 4), MTSHM_SLOT_OVER_LIMIT, "slot2.flags");
	cr_expect_eq(le(g, 5120 + 3 * 128 + 64 + 8, 8), 400,
	             "slot2.lane3.bytes");
	/* Slot 3 at 5632. */
	cr_expect_eq(le(g, 5632 + 0, 4), 9999, "slot3.pid");
	cr_expect_eq(le(g, 5632 + 40, 4), MTSHM_SLOT_CORRUPT, "slot3.flags");
	cr_expect_eq(le(g, 5632 + 64 + 8, 8), UINT64_C(1) << 60,
	             "slot3.lane0.bytes");
}

Test(golden, struct_offsets_match_the_diagram)
{
	/* The same offsets through the structs, so a struct change that kept
	 * its _Static_asserts in step still fails here. */
	cr_expect_eq(offsetof(struct mtshm_header, magic), 0);
	cr_expect_eq(offsetof(struct mtshm_header, version_major), 8);
	cr_expect_eq(offsetof(struct mtshm_header, version_minor), 10);
	cr_expect_eq(offsetof(struct mtshm_header, compat_minor), 12);
	cr_expect_eq(offsetof(struct mtshm_header, header_size), 16);
	cr_expect_eq(offsetof(struct mtshm_header, slot_offset), 20);
	cr_expect_eq(offsetof(struct mtshm_header, slot_stride), 24);
	cr_expect_eq(offsetof(struct mtshm_header, slot_count), 28);
	cr_expect_eq(offsetof(struct mtshm_header, lane_count), 32);
	cr_expect_eq(offsetof(struct mtshm_header, line_size), 36);
	cr_expect_eq(offsetof(struct mtshm_header, segment_size), 40);
	cr_expect_eq(offsetof(struct mtshm_header, generation), 48);
	cr_expect_eq(offsetof(struct mtshm_header, server_pid), 56);
	cr_expect_eq(offsetof(struct mtshm_header, server_uid), 60);
	cr_expect_eq(offsetof(struct mtshm_header, created_ns), 64);
	cr_expect_eq(offsetof(struct mtshm_header, threshold), 72);
	cr_expect_eq(offsetof(struct mtshm_header, names_offset), 80);
	cr_expect_eq(offsetof(struct mtshm_header, names_stride), 84);
	cr_expect_eq(offsetof(struct mtshm_header, reserved1), 88);
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
	cr_expect_eq(MTSHM_MAGIC, le((const unsigned char *)"MEMTALLY", 0, 8));
}

Test(golden, header_fields)
{
	unsigned char *img = golden_copy();
	const struct mtshm_header *h = hdr(img);
	cr_expect_eq(h->magic, MTSHM_MAGIC);
	cr_expect_eq(h->version_major, 1);
	cr_expect_eq(h->version_minor, 0);
	cr_expect_eq(h->compat_minor, 0);
	cr_expect_eq(h->header_size, MTSHM_HEADER_SIZE);
	cr_expect_eq(h->slot_offset, MTSHM_HEADER_SIZE);
	cr_expect_eq(h->slot_stride, G_STRIDE);
	cr_expect_eq(h->slot_count, G_SLOTS);
	cr_expect_eq(h->lane_count, G_LANES);
	cr_expect_eq(h->line_size, MTSHM_LINE);
	cr_expect_eq(h->segment_size, G_SIZE);
	cr_expect_eq(h->generation, UINT64_C(0x0123456789abcdef));
	cr_expect_eq(h->server_pid, 4242);
	cr_expect_eq(h->server_uid, 1000);
	cr_expect_eq(h->created_ns, UINT64_C(1700000000123456789));
	cr_expect_eq(h->threshold, 65536);
}

Test(golden, fleet_snapshot)
{
	unsigned char *img = golden_copy();
	struct mtshm_fleet f;
	memset(&f, 0xa5, sizeof(f));
	mtshm_fleet_read(hdr(img), &f);
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

/* Expected read-back of one slot of the image. */
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
     .uid = 1001,
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
     /* lane 0 holds 2^60: flagged and left out. */
     .sum = 5,
     .flushes = 1,
     .absurd = 1},
};

/* Check every slot of a validated image against want[], addressing slots
 * only through the header's published offset and stride. */
static void check_slots(unsigned char *img, size_t size)
{
	struct mtshm_map m = map_of(img, size);
	int64_t fleet = 0;
	for (uint32_t i = 0; i < G_SLOTS; i++) {
		struct mtshm_slot_id *s = mtshm_slot(&m, i);
		const struct want_slot *w = &want[i];
		cr_assert_eq((unsigned char *)s,
		             img + m.hdr->slot_offset +
		                 (size_t)i * m.hdr->slot_stride);
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
		int64_t sum = mtshm_slot_sum(&m, s, &flushes, &absurd);
		cr_expect_eq(sum, w->sum, "slot %u sum %lld", i,
		             (long long)sum);
		cr_expect_eq(flushes, w->flushes, "slot %u flushes %llu", i,
		             (unsigned long long)flushes);
		cr_expect_eq(absurd, w->absurd, "slot %u absurd", i);
		if (!absurd)
			fleet += sum;
	}
	cr_expect_eq(fleet, (int64_t)m.hdr->fleet.bytes,
	             "the image's fleet total is the sum of its sane slots");
}

Test(golden, slots_through_published_geometry)
{
	unsigned char *img = golden_copy();
	cr_assert_eq(mtshm_validate(img, G_SIZE), 0);
	struct mtshm_map m = map_of(img, G_SIZE);
	check_slots(img, G_SIZE);

	/* Lane addressing: lane k of slot i is at 128k + 64 in the slot. */
	struct mtshm_slot_id *s2 = mtshm_slot(&m, 2);
	for (uint32_t k = 0; k < G_LANES; k++) {
		struct mtshm_lane *l = mtshm_lane(s2, k);
		cr_expect_eq((unsigned char *)l,
		             img + 4096 + 2 * 512 + k * 128 + 64);
		cr_expect_eq(l->owner, 5678 + k);
		cr_expect_eq(l->bytes, 100 * (int64_t)(k + 1));
	}
}

/* --- compatible future minors ---------------------------------------- */

Test(golden, future_minor_compat_0_accepted)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_minor = MTSHM_VERSION_MINOR + 7;
	hdr(img)->compat_minor = 0;
	expect_code(mtshm_validate(img, G_SIZE), 0, "1.7 compat 0");
}

Test(golden, future_minor_compat_ours_accepted)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_minor = MTSHM_VERSION_MINOR + 1;
	hdr(img)->compat_minor = MTSHM_VERSION_MINOR;
	expect_code(mtshm_validate(img, G_SIZE), 0, "compat = our minor");
}

Test(golden, future_minor_larger_header_read_through_slot_offset)
{
	/* A later minor that grew the header page to 8192 bytes: readers
	 * must find the slots through slot_offset, never sizeof(header). */
	enum { HS = 8192, SZ = HS + G_SLOTS * G_STRIDE };
	static unsigned char big[SZ];
	memcpy(big, golden, MTSHM_HEADER_SIZE);
	memcpy(big + HS, golden + MTSHM_HEADER_SIZE, G_SLOTS * G_STRIDE);
	struct mtshm_header *h = (struct mtshm_header *)big;
	h->version_minor = 3;
	h->header_size = HS;
	h->slot_offset = HS;
	h->segment_size = SZ;
	unsigned char *img = guarded_copy(big, SZ);
	expect_code(mtshm_validate(img, SZ), 0, "1.3 with an 8 KiB header");
	check_slots(img, SZ);
}

Test(golden, future_minor_wider_stride_read_through_slot_stride)
{
	/* A later minor that added a line per slot: stride 640 for 4 lanes. */
	enum { ST = G_STRIDE + MTSHM_LINE, SZ = 4096 + G_SLOTS * ST };
	static unsigned char big[SZ];
	memcpy(big, golden, MTSHM_HEADER_SIZE);
	for (size_t i = 0; i < G_SLOTS; i++)
		memcpy(big + 4096 + i * ST, golden + 4096 + i * G_STRIDE,
		       G_STRIDE);
	struct mtshm_header *h = (struct mtshm_header *)big;
	h->version_minor = 2;
	h->slot_stride = ST;
	h->segment_size = SZ;
	unsigned char *img = guarded_copy(big, SZ);
	expect_code(mtshm_validate(img, SZ), 0, "1.2 with stride 640");
	check_slots(img, SZ);
}

/* --- rejected, each with its own code -------------------------------- */

Test(golden, bad_magic)
{
	unsigned char *img = golden_copy();
	img[7] = 'X'; /* "MEMTALLX" */
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_EBADMAGIC, "MEMTALLX");
}

Test(golden, zero_magic_of_a_segment_still_being_created)
{
	unsigned char *img = golden_copy();
	hdr(img)->magic = 0;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_EBADMAGIC, "magic 0");
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
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_EBYTEORDER,
	            "byte-swapped magic");
}

Test(golden, future_major)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_major = 2;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_EVERSION, "major 2");
}

Test(golden, major_zero)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_major = 0;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_EVERSION, "major 0");
}

Test(golden, compat_minor_newer_than_ours)
{
	unsigned char *img = golden_copy();
	hdr(img)->version_minor = MTSHM_VERSION_MINOR + 1;
	hdr(img)->compat_minor = MTSHM_VERSION_MINOR + 1;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_EVERSION,
	            "compat_minor = our minor + 1");
}

Test(golden, truncated_within_the_slots)
{
	static const size_t sizes[] = {
	    G_SIZE - 8,        /* the last lane's last word */
	    G_SIZE - G_STRIDE, /* the whole last slot */
	    MTSHM_HEADER_SIZE + 128,
	    MTSHM_HEADER_SIZE, /* the header and no slot */
	};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		char what[64];
		snprintf(what, sizeof(what), "first %zu bytes", sizes[i]);
		expect_code(
		    mtshm_validate(guarded_copy(golden, sizes[i]), sizes[i]),
		    MTSHM_ETRUNCATED, what);
	}
}

Test(golden, shorter_than_the_header)
{
	/* As segment.c defines it: fewer than 8 bytes cannot even show a
	 * magic (EBADMAGIC); a right magic in a short object is a truncated
	 * segment; anything else is not a segment at all. */
	expect_code(mtshm_validate(guarded_copy(golden, 0), 0), MTSHM_EBADMAGIC,
	            "0 bytes");
	expect_code(mtshm_validate(guarded_copy(golden, 4), 4), MTSHM_EBADMAGIC,
	            "4 bytes");
	expect_code(mtshm_validate(guarded_copy(golden, 8), 8),
	            MTSHM_ETRUNCATED, "the magic alone");
	expect_code(mtshm_validate(guarded_copy(golden, 4088), 4088),
	            MTSHM_ETRUNCATED, "4088 bytes");
	unsigned char junk[4088];
	memset(junk, 0x5a, sizeof(junk));
	expect_code(mtshm_validate(guarded_copy(junk, 4088), 4088),
	            MTSHM_EBADMAGIC, "4088 bytes of junk");
}

/*
 * Layout checks. Each variant is built so that only the check under test
 * can refuse it: with that check gone the image would be accepted (or
 * rejected with another code), so the test fails.
 */

Test(golden, stride_not_a_multiple_of_the_line)
{
	unsigned char *img = golden_copy();
	hdr(img)->slot_stride = G_STRIDE + 8;
	hdr(img)->slot_count = 3; /* 4096 + 3 * 520 still fits */
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT, "stride 520");
}

Test(golden, stride_smaller_than_its_lanes)
{
	unsigned char *img = golden_copy();
	hdr(img)->slot_stride = G_STRIDE - MTSHM_LINE; /* 3 lines, 4 lanes */
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT, "stride 384");
}

Test(golden, stride_zero)
{
	unsigned char *img = golden_copy();
	hdr(img)->slot_stride = 0;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT, "stride 0");
}

Test(golden, lane_count_zero)
{
	unsigned char *img = golden_copy();
	hdr(img)->lane_count = 0;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT, "0 lanes");
}

Test(golden, lane_count_over_max)
{
	unsigned char *img = golden_copy();
	struct mtshm_header *h = hdr(img);
	h->lane_count = MTSHM_MAX_LANES + 1;
	h->slot_stride = (MTSHM_MAX_LANES + 1) * MTSHM_LINE;
	h->slot_count = 1;
	h->segment_size = UINT64_MAX;
	/* Without the cap this would be ETRUNCATED; with it, ELAYOUT. */
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT, "65 lanes");
}

Test(golden, slot_offset_inside_the_header)
{
	unsigned char *img = golden_copy();
	hdr(img)->slot_offset = MTSHM_HEADER_SIZE - MTSHM_LINE;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT,
	            "slot_offset 3968");
	hdr(img)->slot_offset = 0;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT,
	            "slot_offset 0");
}

Test(golden, slot_offset_not_line_aligned)
{
	unsigned char *img = golden_copy();
	hdr(img)->slot_offset = MTSHM_HEADER_SIZE + 64;
	hdr(img)->slot_count = 3;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT,
	            "slot_offset 4160");
}

Test(golden, header_size_smaller_than_a_page)
{
	unsigned char *img = golden_copy();
	hdr(img)->header_size = 2048;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT,
	            "header_size 2048");
}

Test(golden, line_size_not_128)
{
	unsigned char *img = golden_copy();
	hdr(img)->line_size = 64;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT, "line 64");
}

Test(golden, slot_count_zero)
{
	unsigned char *img = golden_copy();
	hdr(img)->slot_count = 0;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT, "0 slots");
}

Test(golden, slot_count_over_max)
{
	unsigned char *img = golden_copy();
	hdr(img)->slot_count = MTSHM_MAX_SLOTS + 1;
	hdr(img)->segment_size = UINT64_MAX;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT,
	            "MTSHM_MAX_SLOTS + 1 slots");
}

Test(golden, segment_size_smaller_than_its_slots)
{
	unsigned char *img = golden_copy();
	hdr(img)->segment_size = G_SIZE - G_STRIDE;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ELAYOUT,
	            "segment_size 5632");
}

Test(golden, more_slots_declared_than_mapped)
{
	/* Consistent header, object cut short: truncated, not a bad layout. */
	unsigned char *img = golden_copy();
	hdr(img)->slot_count = G_SLOTS + 1;
	hdr(img)->segment_size = G_SIZE + G_STRIDE;
	expect_code(mtshm_validate(img, G_SIZE), MTSHM_ETRUNCATED,
	            "5 slots declared, 4 mapped");
}

#endif /* little-endian */
