/*
 * mtshm.h - the memtally shared-memory segment. This header IS the format.
 *
 * A segment is a named POSIX shared-memory object created by memtallyd. It
 * holds one header page followed by `slot_count` slots, one per registered
 * worker process. Workers write their counters into their own slot; the
 * server reads every live slot each tick and publishes fleet totals back
 * into the header, so a reader learns the fleet state with a few loads.
 *
 * Byte layout, version 1.1 (little-endian, as every field is host order and
 * the magic exposes a byte-order mismatch). 1.1 added the per-slot names
 * region (names_offset, names_stride); a 1.0 reader ignores it, so
 * compat_minor stays 0:
 *
 *   offset  size  header page (4096 bytes, server-written)
 *   ------  ----  ---------------------------------------------------------
 *        0     8  magic            "MEMTALLY" read as a little-endian u64
 *        8     2  version_major    readers refuse a major they do not know
 *       10     2  version_minor    minors only add fields at the end
 *       12     2  compat_minor     oldest minor a reader may have and still
 *                                  use this segment (0 in 1.x so far)
 *       14     2  reserved0
 *       16     4  header_size      bytes before the first slot (4096)
 *       20     4  slot_offset      published: readers use this, not sizeof
 *       24     4  slot_stride      published: bytes from slot i to i+1
 *       28     4  slot_count
 *       32     4  lane_count       lanes per slot; lane k is in line k
 *       36     4  line_size        128
 *       40     8  segment_size     bytes the creator sized the object to
 *       48     8  generation       new random value on every re-creation
 *       56     4  server_pid
 *       60     4  server_uid
 *       64     8  created_ns       CLOCK_REALTIME at creation
 *       72     8  threshold        flush threshold workers must use (bytes)
 *       80     4  names_offset     (1.1) published: the names region, 0 = none
 *       84     4  names_stride     (1.1) bytes from slot i's names to i+1's
 *       88    40  reserved1
 *      128   128  fleet            struct mtshm_fleet (seqlock snapshot)
 *      256  3840  reserved2        zero; later minors may claim it
 *
 *   slot i starts at slot_offset + i * slot_stride and spans lane_count
 *   lines of 128 bytes:
 *
 *   line 0   0..63  struct mtshm_slot_id   identity (server) + a few
 *                                          client-written process words
 *           64..127 struct mtshm_lane      lane 0
 *   line k   0..63  reserved               (k >= 1)
 *           64..127 struct mtshm_lane      lane k
 *
 *   (1.1) after the slots, at names_offset: slot_count entries of
 *   names_stride bytes, struct mtshm_slot_names (server-written): what a
 *   restarted server needs to adopt a live worker (its image id, group and
 *   task), which the slot's 64 identity bytes have no room for.
 *
 * Every lane sits in its own 128-byte line, so two threads flushing into
 * their own lanes never share a cache line nor an adjacent-line prefetch
 * pair (measured: +250 ns per pair when they do, +10 ns when they do not).
 *
 * Writers: each field has exactly one writer. The server writes identity,
 * limit, peak and flags; a lane's `bytes` and `flushes` are written only by
 * the thread that owns the lane (claimed with a CAS on `owner`); `overflow`,
 * `threads` and `lanes_used` are written by any thread of the slot's process
 * with atomic read-modify-writes. Nobody takes a lock.
 *
 * Readers: the server sums lanes [0, lanes_used) plus `overflow` without a
 * lock. A read that races a flush sees the lane either before or after the
 * 8-byte store, never torn (aligned 8-byte accesses are atomic), so the sum
 * is off by at most one in-flight flush -- within the accuracy the design
 * already allows (threshold x live threads), and corrected next tick.
 *
 * All shared accesses go through the helpers in mtshm_atomic.h, which name
 * their memory order. No field is `volatile`.
 */
#ifndef MEMTALLY_SHM_H
#define MEMTALLY_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mtshm_atomic.h"

#define MTSHM_MAGIC         UINT64_C(0x594c4c41544d454d) /* "MEMTALLY" */
#define MTSHM_MAGIC_SWAPPED UINT64_C(0x4d454d54414c4c59)
#define MTSHM_VERSION_MAJOR 1
#define MTSHM_VERSION_MINOR 1
#define MTSHM_COMPAT_MINOR  0
#define MTSHM_LINE          128u
#define MTSHM_HEADER_SIZE   4096u
#define MTSHM_MAX_LANES     64u
#define MTSHM_MAX_SLOTS     (1u << 20)
#define MTSHM_DEFAULT_LANES 4u

/* A counter no machine could hold (1 PiB): a slot showing one is corrupt. */
#define MTSHM_ABSURD_BYTES (INT64_C(1) << 50)

/* Fleet states, as published in the header and in the protocol. */
enum mtshm_state {
	MTSHM_STATE_OK = 0,
	MTSHM_STATE_HIGH = 1,
	MTSHM_STATE_OVER = 2,
};

/* Slot flags (server-written). */
#define MTSHM_SLOT_OVER_LIMIT 0x1u /* the process is over its own limit */
#define MTSHM_SLOT_CORRUPT    0x2u /* counters absurd: not summed */

/*
 * Fleet figures the server publishes every tick, under a seqlock so a
 * reader gets one consistent snapshot. No standalone fences (ThreadSanitizer
 * does not model them): the fields are stored with release and loaded with
 * acquire, which is free on x86-64.
 *
 * Writer (mtshm_fleet_publish):     Reader (mtshm_fleet_read):
 *   seq = s + 1        (relaxed)      do {
 *   each field         (release)        s1 = seq           (acquire)
 *   seq = s + 2        (release)        each field         (acquire)
 *                                       s2 = seq           (relaxed)
 *                                     } while (s1 odd || s1 != s2)
 *
 * The reader gives up after MTSHM_FLEET_READ_TRIES rounds (a writer killed
 * inside leaves `seq` odd forever) and says so.
 */
#define MTSHM_FLEET_READ_TRIES 10000
struct mtshm_fleet {
	uint64_t seq;          /*   0 */
	uint64_t bytes;        /*   8 accounted live bytes, all slots */
	uint64_t peak;         /*  16 highest `bytes` seen by the server */
	uint64_t limit;        /*  24 0 = no limit */
	uint64_t reserved;     /*  32 outstanding admission reservations */
	uint64_t error_bytes;  /*  40 +/- threshold x live threads */
	uint64_t heartbeat_ns; /*  48 CLOCK_MONOTONIC at the last tick */
	uint64_t ticks;        /*  56 number of ticks so far */
	uint32_t state;        /*  64 enum mtshm_state */
	uint32_t processes;    /*  68 registered live processes */
	uint32_t unregistered; /*  72 workers refused for lack of slots */
	uint32_t spare0;       /*  76 */
	uint64_t spare[6];     /*  80 zero in 1.0 */
};

struct mtshm_header {
	uint64_t magic;         /*   0 */
	uint16_t version_major; /*   8 */
	uint16_t version_minor; /*  10 */
	uint16_t compat_minor;  /*  12 */
	uint16_t reserved0;     /*  14 */
	uint32_t header_size;   /*  16 */
	uint32_t slot_offset;   /*  20 */
	uint32_t slot_stride;   /*  24 */
	uint32_t slot_count;    /*  28 */
	uint32_t lane_count;    /*  32 */
	uint32_t line_size;     /*  36 */
	uint64_t segment_size;  /*  40 */
	uint64_t generation;    /*  48 */
	uint32_t server_pid;    /*  56 */
	uint32_t server_uid;    /*  60 */
	uint64_t created_ns;    /*  64 */
	uint64_t threshold;     /*  72 */
	uint32_t names_offset;  /*  80 (1.1) */
	uint32_t names_stride;  /*  84 (1.1) */
	uint64_t reserved1[5];  /*  88 */
	struct mtshm_fleet fleet;                     /* 128 */
	uint8_t reserved2[MTSHM_HEADER_SIZE - 256]; /* 256 */
};

/*
 * Identity of a slot: the first 64 bytes of its first line. `pid == 0`
 * means the slot is free. The server never trusts these fields when read
 * back: its own registry is authoritative, and these are a published copy
 * for the client (and for debugging tools).
 */
struct mtshm_slot_id {
	uint32_t pid;        /*  0 server: owner pid, 0 = free */
	uint32_t uid;        /*  4 server */
	uint64_t generation; /*  8 server: bumped on every (re)assignment */
	uint64_t start_time; /* 16 server: /proc/PID/stat starttime (ticks) */
	uint64_t limit;      /* 24 server: per-process limit, 0 = none */
	uint64_t peak;       /* 32 server: highest total seen at a tick */
	uint32_t flags;      /* 40 server: MTSHM_SLOT_* */
	uint32_t group;      /* 44 server: group index, for tools */
	uint32_t threads;    /* 48 client: live accounted threads */
	uint32_t lanes_used; /* 52 client: lanes [0, lanes_used) claimed */
	int64_t overflow;    /* 56 client: bytes of threads without a lane */
};

/*
 * A lane: the counters of one thread (or, when a process has more threads
 * than lanes, lane-less threads add into `overflow` instead). `bytes` is
 * the net bytes flushed through this lane since the slot was assigned; it
 * may be negative when one thread frees what another allocated.
 */
struct mtshm_lane {
	uint32_t owner;    /*  0 client: tid holding the lane, 0 = none */
	uint32_t spare0;   /*  4 */
	int64_t bytes;     /*  8 client (owner only) */
	uint64_t flushes;  /* 16 client (owner only) */
	uint64_t spare[5]; /* 24 */
};

/*
 * (1.1) Names of slot i, server-written at registration, read by a server
 * that adopts the segment after a restart. Strings are NUL-terminated and
 * truncated to fit; the client keeps group and task names below 64 bytes.
 */
struct mtshm_slot_names {
	uint64_t image_id;      /*   0 Register.image_id */
	uint64_t registered_ns; /*   8 CLOCK_REALTIME at registration */
	char group[64];         /*  16 */
	char task[64];          /*  80 */
	uint8_t spare[112];     /* 144 zero in 1.1 */
};
#define MTSHM_NAMES_STRIDE 256u

_Static_assert(sizeof(struct mtshm_slot_names) == MTSHM_NAMES_STRIDE, "names");
_Static_assert(offsetof(struct mtshm_slot_names, group) == 16, "names.group");
_Static_assert(offsetof(struct mtshm_slot_names, task) == 80, "names.task");
_Static_assert(sizeof(struct mtshm_fleet) == 128, "fleet line");
_Static_assert(offsetof(struct mtshm_fleet, bytes) == 8, "fleet.bytes");
_Static_assert(offsetof(struct mtshm_fleet, limit) == 24, "fleet.limit");
_Static_assert(offsetof(struct mtshm_fleet, heartbeat_ns) == 48, "fleet.hb");
_Static_assert(offsetof(struct mtshm_fleet, state) == 64, "fleet.state");
_Static_assert(offsetof(struct mtshm_fleet, unregistered) == 72, "fleet.unreg");
_Static_assert(offsetof(struct mtshm_fleet, spare) == 80, "fleet.spare");
_Static_assert(sizeof(struct mtshm_header) == MTSHM_HEADER_SIZE, "header");
_Static_assert(offsetof(struct mtshm_header, version_major) == 8, "major");
_Static_assert(offsetof(struct mtshm_header, compat_minor) == 12, "compat");
_Static_assert(offsetof(struct mtshm_header, header_size) == 16, "hsize");
_Static_assert(offsetof(struct mtshm_header, slot_offset) == 20, "soff");
_Static_assert(offsetof(struct mtshm_header, slot_stride) == 24, "stride");
_Static_assert(offsetof(struct mtshm_header, slot_count) == 28, "count");
_Static_assert(offsetof(struct mtshm_header, lane_count) == 32, "lanes");
_Static_assert(offsetof(struct mtshm_header, segment_size) == 40, "size");
_Static_assert(offsetof(struct mtshm_header, generation) == 48, "gen");
_Static_assert(offsetof(struct mtshm_header, server_pid) == 56, "spid");
_Static_assert(offsetof(struct mtshm_header, created_ns) == 64, "created");
_Static_assert(offsetof(struct mtshm_header, threshold) == 72, "threshold");
_Static_assert(offsetof(struct mtshm_header, names_offset) == 80, "names_off");
_Static_assert(offsetof(struct mtshm_header, names_stride) == 84, "names_str");
_Static_assert(offsetof(struct mtshm_header, reserved1) == 88, "reserved1");
_Static_assert(offsetof(struct mtshm_header, fleet) == 128, "fleet");
_Static_assert(offsetof(struct mtshm_header, reserved2) == 256, "reserved2");
_Static_assert(sizeof(struct mtshm_slot_id) == 64, "slot id");
_Static_assert(offsetof(struct mtshm_slot_id, generation) == 8, "slot gen");
_Static_assert(offsetof(struct mtshm_slot_id, start_time) == 16, "slot st");
_Static_assert(offsetof(struct mtshm_slot_id, limit) == 24, "slot limit");
_Static_assert(offsetof(struct mtshm_slot_id, peak) == 32, "slot peak");
_Static_assert(offsetof(struct mtshm_slot_id, flags) == 40, "slot flags");
_Static_assert(offsetof(struct mtshm_slot_id, threads) == 48, "slot thr");
_Static_assert(offsetof(struct mtshm_slot_id, overflow) == 56, "slot ovf");
_Static_assert(sizeof(struct mtshm_lane) == 64, "lane");
_Static_assert(offsetof(struct mtshm_lane, bytes) == 8, "lane bytes");
_Static_assert(offsetof(struct mtshm_lane, flushes) == 16, "lane flushes");
_Static_assert(sizeof(struct mtshm_slot_id) + sizeof(struct mtshm_lane) ==
		       MTSHM_LINE,
	       "line 0 is identity + lane 0");

/* Errors of this component: a reserved negative range, apart from -errno. */
#define MTSHM_EBADMAGIC  (-3001) /* not a memtally segment */
#define MTSHM_EVERSION   (-3002) /* unknown major or too-new compat minor */
#define MTSHM_ETRUNCATED (-3003) /* object smaller than its declared slots */
#define MTSHM_ELAYOUT    (-3004) /* impossible offsets, stride or counts */
#define MTSHM_EBYTEORDER (-3005) /* written by a machine of other byte order */

/* A mapped segment. Plain struct: owned by the caller, closed with
 * mtshm_close(). */
struct mtshm_map {
	void *base;
	size_t size;
	struct mtshm_header *hdr;
};

/* Parameters for mtshm_create(). */
struct mtshm_params {
	uint32_t slots;     /* >= 1, <= MTSHM_MAX_SLOTS */
	uint32_t lanes;     /* >= 1, <= MTSHM_MAX_LANES */
	uint64_t threshold; /* flush threshold, bytes, > 0 */
	mode_t mode;        /* e.g. 0660 */
	int gid;            /* group to chown to, or -1 to keep */
};

/*
 * Create (replacing any existing object of that name) and map a segment.
 * Everything is initialised before the magic is written, with release
 * order, so a concurrent opener either refuses it or sees it whole.
 * Returns 0 or -errno (-EINVAL for bad params).
 */
int mtshm_create(const char *name, const struct mtshm_params *p,
		 struct mtshm_map *out);

/*
 * Open and map an existing segment, read-write or read-only, and validate
 * it with mtshm_validate(). Returns 0, -errno, or an MTSHM_E* code.
 */
int mtshm_open(const char *name, int writable, struct mtshm_map *out);

/*
 * Check a header of `size` mapped bytes: magic (and byte order), version,
 * published geometry, and that `size` covers every declared slot.
 * Returns 0 or an MTSHM_E* code. Never reads beyond `size`.
 */
int mtshm_validate(const void *base, size_t size);

/* Unmap. Accepts NULL, a zeroed or an already closed map. */
void mtshm_close(struct mtshm_map *m);

/* Remove the named object. Returns 0 or -errno. */
int mtshm_unlink(const char *name);

/* A short description of an MTSHM_E* code or -errno. */
const char *mtshm_strerror(int err);

/* Read the fleet snapshot (seqlock reader loop). Returns 0, or -EAGAIN when
 * no consistent snapshot was seen in MTSHM_FLEET_READ_TRIES rounds (the
 * writer died inside, or the segment is corrupt); *out then holds the last
 * attempt. */
int mtshm_fleet_read(const struct mtshm_header *h, struct mtshm_fleet *out);

/* Publish a fleet snapshot (seqlock writer). Single writer: the server. The
 * `seq` of `f` is ignored. */
void mtshm_fleet_publish(struct mtshm_header *h, const struct mtshm_fleet *f);

/* Address of slot `i`'s identity, using the published offset and stride. */
static inline struct mtshm_slot_id *mtshm_slot(const struct mtshm_map *m,
					       uint32_t i)
{
	const struct mtshm_header *h = m->hdr;
	return (struct mtshm_slot_id *)((char *)m->base + h->slot_offset +
					(size_t)i * h->slot_stride);
}

/* (1.1) Names of slot `i`, or NULL in a segment without the region. */
static inline struct mtshm_slot_names *mtshm_names(const struct mtshm_map *m,
						   uint32_t i)
{
	const struct mtshm_header *h = m->hdr;
	if (!h->names_offset)
		return NULL;
	return (struct mtshm_slot_names *)((char *)m->base + h->names_offset +
					   (size_t)i * h->names_stride);
}

/* Address of lane `k` of the slot whose identity is `s`. */
static inline struct mtshm_lane *mtshm_lane(struct mtshm_slot_id *s,
					    uint32_t k)
{
	return (struct mtshm_lane *)((char *)s + (size_t)k * MTSHM_LINE +
				     sizeof(struct mtshm_slot_id));
}

/*
 * Sum a slot's counters: lanes [0, min(lanes_used, lane_count)) plus
 * overflow. Lock-free; see the comment at the top for why a racing read is
 * harmless. Sets *absurd when a counter is beyond MTSHM_ABSURD_BYTES.
 */
int64_t mtshm_slot_sum(const struct mtshm_map *m, struct mtshm_slot_id *s,
		       uint64_t *flushes, int *absurd);

/*
 * mtshm_slot_sum() itself, inline, for the server's tick: `lane_count` is
 * the header's, which the caller reads once per tick rather than once per
 * slot. Same semantics (lanes_used clamped, absurd values flagged and left
 * out); both pointers must be valid. Inlined, the out-of-line call and the
 * NULL checks per slot go away (measured in bench/RESULTS.md, server).
 */
static inline int64_t mtshm_slot_sum_inline(struct mtshm_slot_id *s,
                                            uint32_t lane_count,
                                            uint64_t *flushes, int *absurd)
{
	uint32_t used = mt_load_relaxed32(&s->lanes_used);
	if (used > lane_count)
		used = lane_count;
	/* Absurd values are flagged and left out, so the sum of at most
	 * MTSHM_MAX_LANES + 1 sane values cannot overflow. */
	int64_t sum = mt_load_relaxeds64(&s->overflow);
	int bad = sum > MTSHM_ABSURD_BYTES || sum < -MTSHM_ABSURD_BYTES;
	if (bad)
		sum = 0;
	uint64_t nf = 0;
	for (uint32_t k = 0; k < used; k++) {
		struct mtshm_lane *l = mtshm_lane(s, k);
		int64_t b = mt_load_relaxeds64(&l->bytes);
		if (b > MTSHM_ABSURD_BYTES || b < -MTSHM_ABSURD_BYTES)
			bad = 1;
		else
			sum += b;
		nf += mt_load_relaxed64(&l->flushes);
	}
	if (sum > MTSHM_ABSURD_BYTES || sum < -MTSHM_ABSURD_BYTES)
		bad = 1;
	*flushes = nf;
	*absurd = bad;
	return sum;
}

/*
 * Ask for slot `i`'s first line (identity and lane 0: all a one-thread
 * process's counters) ahead of its sum. The tick visits slots in an order
 * the hardware prefetcher cannot guess, so it says which it will need a
 * few slots early and their misses overlap. A hint: never faults.
 */
static inline void mtshm_slot_prefetch(const struct mtshm_map *m, uint32_t i)
{
	const char *s = (const char *)mtshm_slot(m, i);
	/* The 48..127 bytes the sum reads span both 64-byte halves. */
	__builtin_prefetch(s + 48, 0, 3);
	__builtin_prefetch(s + 64, 0, 3);
}

#endif /* MEMTALLY_SHM_H */
