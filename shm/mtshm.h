/*
 * mtshm.h - the memtally shared-memory segment. This header IS the format.
 *
 * Layout 2.2 (MTSHM_VERSION_MAJOR.MTSHM_VERSION_MINOR). Two kinds of
 * object, both anonymous memory (memfd_create), never names in /dev/shm
 * that someone else could pre-create, open or truncate, and both handed
 * to a worker over the registration socket (SCM_RIGHTS):
 *
 *  - the header: one 4096-byte page the server alone writes (layout, flush
 *    threshold, heartbeat, fleet snapshot). Sealed against resizing and
 *    against new writable mappings (F_SEAL_SHRINK | F_SEAL_GROW |
 *    F_SEAL_FUTURE_WRITE | F_SEAL_SEAL): the server's own mapping, made
 *    before the seal, stays writable; a worker can only map it read-only,
 *    whatever descriptor it holds or reopens through /proc.
 *  - a slot table per uid: slot_count slots of slot_stride bytes, holding
 *    the slots of that uid's processes only. Sealed against resizing
 *    (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): its size is fixed for
 *    every mapper, so no access inside it faults for its size. (Under
 *    strict overcommit, a first touch of a page past the commit limit
 *    still does: the server allocates a slot's pages before it is used,
 *    and a worker that punches a hole in its own slot at that limit makes
 *    the server's next read of it fault, which the server answers.)
 *    The server maps it whole; a worker of the uid maps read-write only
 *    the page(s) holding its own slot, between inaccessible guards
 *    (mtshm_map_window), so a stray write of its own program faults
 *    rather than reach a neighbour's slot. Processes of one uid can
 *    ptrace each other anyway, so they share nothing they could not
 *    already reach, and other uids share nothing writable at all.
 *
 * Whoever maps an object checks its seals and size first (mtshm_map_fd),
 * and copies every layout value it will use, once, into private memory
 * (struct mtshm_layout). Nothing is ever read back from shared memory to
 * compute an address.
 *
 * Slot indices are the server's, fleet-wide: slot i of the fleet lives at
 * i * slot_stride in the table of its process's uid (the tables are
 * sparse: only the pages of used slots are ever touched).
 *
 * Header page, version 2.1 (little-endian host order; the magic exposes a
 * byte-order mismatch):
 *
 *   offset  size  field
 *   ------  ----  ---------------------------------------------------------
 *        0     8  magic            "MEMTALLY" read as a little-endian u64
 *        8     2  version_major    readers refuse a major they do not know
 *       10     2  version_minor    minors only add fields at the end
 *       12     2  compat_minor     oldest minor a reader may have and still
 *                                  use this segment (0 in 2.x so far)
 *       14     2  reserved0
 *       16     4  header_size      4096
 *       20     4  reserved_off     0 (1.x: slots followed the header)
 *       24     4  slot_stride      bytes from slot i to i+1 in a table
 *       28     4  slot_count
 *       32     4  lane_count       lanes per slot; lane k is in line k
 *       36     4  line_size        128
 *       40     8  table_size       bytes of each slot table object
 *       48     8  generation       new random value per created header
 *       56     4  server_pid
 *       60     4  server_uid
 *       64     8  created_ns       CLOCK_REALTIME at creation
 *       72     8  threshold        flush threshold workers must use (bytes)
 *       80    48  reserved1
 *      128   128  fleet            struct mtshm_fleet (seqlock snapshot)
 *      256  3840  reserved2        zero; later minors may claim it
 *
 *   slot i spans lane_count lines of 128 bytes:
 *
 *   line 0   0..63  struct mtshm_slot_id   identity (server) + a few
 *                                          client-written process words
 *           64..127 struct mtshm_lane      lane 0, whose `mapped` word
 *                                          (line offset 88) is the
 *                                          process's mapped bytes (2.1)
 *                                          and whose words at line offsets
 *                                          96..119 its allocator's free
 *                                          bytes (2.2)
 *   line k   0..63  reserved               (k >= 1)
 *           64..127 struct mtshm_lane      lane k (`mapped` and the free
 *                                          words unused, 0)
 *
 * Minor versions: 2.1 added the process's mapped bytes (lane 0's
 * `mapped`, written by the client) and the fleet's (`fleet.mapped`,
 * written by the server), both in words that were zero in 2.0, and keeps
 * compat_minor 0: a 2.0 reader ignores them and reads every 2.0 field
 * where it was; a 2.0 client leaves `mapped` at the 0 the server stored.
 * 2.2 added the bytes the process's allocator keeps free (lane 0's
 * `free_seq`, `free_bytes`, `free_heap`, written by the client; the
 * fleet's `allocator_free`, written by the server), again in words that
 * were zero, again with compat_minor 0.
 *
 * Every lane sits in its own 128-byte line, so two threads flushing into
 * their own lanes never share a cache line nor an adjacent-line prefetch
 * pair (measured: +250 ns per pair when they do, +10 ns when they do not).
 *
 * Writers: each field has one intended writer. The server writes identity,
 * limit, peak and flags; a lane's `bytes` and `flushes` are written only by
 * the thread that owns the lane (claimed with a CAS on `owner`); `overflow`,
 * `threads` and `lanes_used` are written by any thread of the slot's process
 * with atomic read-modify-writes. Nobody takes a lock. A misbehaving
 * process of the same uid may write anything into its uid's table: the
 * server never trusts identity read back (its registry is authoritative)
 * and judges counters only on a slot's total.
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
#include <fcntl.h>
#include <sys/types.h>

#include "mtshm_atomic.h"

#define MTSHM_MAGIC         UINT64_C(0x594c4c41544d454d) /* "MEMTALLY" */
#define MTSHM_MAGIC_SWAPPED UINT64_C(0x4d454d54414c4c59)
#define MTSHM_VERSION_MAJOR 2
#define MTSHM_VERSION_MINOR 2
#define MTSHM_COMPAT_MINOR  0
#define MTSHM_LINE          128u
#define MTSHM_HEADER_SIZE   4096u
#define MTSHM_MAX_LANES     64u
#define MTSHM_MAX_SLOTS     (1u << 20)
#define MTSHM_DEFAULT_LANES 4u

/* A total no machine could hold (1 PiB): a slot whose lanes add up to one
 * is corrupt. Judged on the slot's total only: one lane's running value
 * may grow without bound (a thread that frees what others allocated). */
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
/* The kernel's figure of the process disagrees with its mapped bytes:
 * reconcile them at the next publish (client/mmap.c). A client that does
 * not know the flag publishes fully once at its rise, as at any change. */
#define MTSHM_SLOT_RECONCILE 0x4u
/* Register again: a restarted server found this slot naming the
 * process, which it could not adopt (no record of it), and holds it, lanes
 * untouched, until the process has a new slot and has carried its total
 * there. A client that does not know the flag stays uncounted. */
#define MTSHM_SLOT_REATTACH 0x8u

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
	uint64_t seq;            /*   0 */
	uint64_t bytes;          /*   8 accounted live bytes, all slots */
	uint64_t peak;           /*  16 highest `bytes` seen by the server */
	uint64_t limit;          /*  24 0 = no limit */
	uint64_t reserved;       /*  32 outstanding admission reservations */
	uint64_t error_bytes;    /*  40 +/- threshold x live threads */
	uint64_t heartbeat_ns;   /*  48 CLOCK_MONOTONIC at the last tick */
	uint64_t ticks;          /*  56 number of ticks so far */
	uint32_t state;          /*  64 enum mtshm_state */
	uint32_t processes;      /*  68 registered live processes */
	uint32_t unregistered;   /*  72 workers refused for lack of slots */
	uint32_t spare0;         /*  76 */
	uint64_t mapped;         /*  80 mapped bytes, all slots (2.1; part
	                          *     of `bytes`) */
	uint64_t allocator_free; /* 88 allocators' free bytes, all slots
	                          *    (2.2; part of `bytes`) */
	uint64_t spare[4];       /*  96 zero */
};

struct mtshm_header {
	uint64_t magic;                             /*   0 */
	uint16_t version_major;                     /*   8 */
	uint16_t version_minor;                     /*  10 */
	uint16_t compat_minor;                      /*  12 */
	uint16_t reserved0;                         /*  14 */
	uint32_t header_size;                       /*  16 */
	uint32_t reserved_off;                      /*  20 */
	uint32_t slot_stride;                       /*  24 */
	uint32_t slot_count;                        /*  28 */
	uint32_t lane_count;                        /*  32 */
	uint32_t line_size;                         /*  36 */
	uint64_t table_size;                        /*  40 */
	uint64_t generation;                        /*  48 */
	uint32_t server_pid;                        /*  56 */
	uint32_t server_uid;                        /*  60 */
	uint64_t created_ns;                        /*  64 */
	uint64_t threshold;                         /*  72 */
	uint64_t reserved1[6];                      /*  80 */
	struct mtshm_fleet fleet;                   /* 128 */
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
 *
 * `mapped` (2.1) is meaningful in lane 0 only: the bytes of anonymous
 * memory the process mapped itself and still holds, as an absolute value
 * (never a delta), stored by whichever thread of the process just changed
 * its table of mapped regions (client/mmap.c, under that table's lock, so
 * stores are ordered). It is exact, not a drift: it adds nothing to the
 * error bar. The server adds it to the slot's heap bytes (`bytes` of the
 * lanes) for the process's total. It sits in lane 0's line, which the
 * tick reads anyway.
 *
 * `free_seq`, `free_bytes` and `free_heap` (2.2), lane 0 only: a sample of
 * the memory the process's allocator holds free (glibc: freed chunks it
 * has not given back to the kernel; jemalloc: its dirty and muzzy pages
 * and the free room of its slabs), taken now and then by the client.
 * `free_bytes` is that free memory at the sample and `free_heap` the
 * process's heap bytes (the lanes and `overflow`) at the same moment; the
 * server follows the heap from it until the next sample
 * (mtshm_free_now()).
 * The client writes the pair under `free_seq` (odd while writing, one
 * writer at a time); a reader that sees it odd or changed keeps its
 * previous value. All zero: nothing sampled (yet, or a 2.1 client).
 */
struct mtshm_lane {
	uint32_t owner;     /*  0 client: tid holding the lane, 0 = none */
	uint32_t spare0;    /*  4 */
	int64_t bytes;      /*  8 client (owner only) */
	uint64_t flushes;   /* 16 client (owner only) */
	int64_t mapped;     /* 24 client, lane 0 only (see above) */
	uint64_t free_seq;  /* 32 client, lane 0 only (2.2, see above) */
	int64_t free_bytes; /* 40 client, lane 0 only (2.2) */
	int64_t free_heap;  /* 48 client, lane 0 only (2.2) */
	uint64_t spare;     /* 56 */
};

_Static_assert(sizeof(struct mtshm_fleet) == 128, "fleet line");
_Static_assert(offsetof(struct mtshm_fleet, bytes) == 8, "fleet.bytes");
_Static_assert(offsetof(struct mtshm_fleet, limit) == 24, "fleet.limit");
_Static_assert(offsetof(struct mtshm_fleet, heartbeat_ns) == 48, "fleet.hb");
_Static_assert(offsetof(struct mtshm_fleet, state) == 64, "fleet.state");
_Static_assert(offsetof(struct mtshm_fleet, unregistered) == 72, "fleet.unreg");
_Static_assert(offsetof(struct mtshm_fleet, mapped) == 80, "fleet.mapped");
_Static_assert(offsetof(struct mtshm_fleet, allocator_free) == 88,
               "fleet.allocator_free");
_Static_assert(offsetof(struct mtshm_fleet, spare) == 96, "fleet.spare");
_Static_assert(sizeof(struct mtshm_header) == MTSHM_HEADER_SIZE, "header");
_Static_assert(offsetof(struct mtshm_header, version_major) == 8, "major");
_Static_assert(offsetof(struct mtshm_header, compat_minor) == 12, "compat");
_Static_assert(offsetof(struct mtshm_header, header_size) == 16, "hsize");
_Static_assert(offsetof(struct mtshm_header, reserved_off) == 20, "roff");
_Static_assert(offsetof(struct mtshm_header, slot_stride) == 24, "stride");
_Static_assert(offsetof(struct mtshm_header, slot_count) == 28, "count");
_Static_assert(offsetof(struct mtshm_header, lane_count) == 32, "lanes");
_Static_assert(offsetof(struct mtshm_header, table_size) == 40, "tsize");
_Static_assert(offsetof(struct mtshm_header, generation) == 48, "gen");
_Static_assert(offsetof(struct mtshm_header, server_pid) == 56, "spid");
_Static_assert(offsetof(struct mtshm_header, created_ns) == 64, "created");
_Static_assert(offsetof(struct mtshm_header, threshold) == 72, "threshold");
_Static_assert(offsetof(struct mtshm_header, reserved1) == 80, "reserved1");
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
_Static_assert(offsetof(struct mtshm_lane, mapped) == 24, "lane mapped");
_Static_assert(offsetof(struct mtshm_lane, free_seq) == 32, "lane free_seq");
_Static_assert(offsetof(struct mtshm_lane, free_bytes) == 40, "lane free");
_Static_assert(offsetof(struct mtshm_lane, free_heap) == 48, "lane heap");
_Static_assert(sizeof(struct mtshm_slot_id) + sizeof(struct mtshm_lane) ==
                   MTSHM_LINE,
               "line 0 is identity + lane 0");

/* Errors of this component: a reserved negative range, apart from -errno. */
#define MTSHM_EBADMAGIC  (-3001) /* not a memtally segment */
#define MTSHM_EVERSION   (-3002) /* unknown major or too-new compat minor */
#define MTSHM_ETRUNCATED (-3003) /* object smaller than its declared slots */
#define MTSHM_ELAYOUT    (-3004) /* impossible offsets, stride or counts */
#define MTSHM_EBYTEORDER (-3005) /* written by a machine of other byte order   \
	                          */
#define MTSHM_EUNSEALED (-3006)  /* an object that could be resized */

/* memfd seals (linux/fcntl.h), for includers without _GNU_SOURCE. */
#ifndef F_SEAL_SEAL
#define F_SEAL_SEAL   0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW   0x0004
#define F_SEAL_WRITE  0x0008
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* The seals each kind of object must carry before anyone maps it. */
#define MTSHM_SEALS_TABLE  (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define MTSHM_SEALS_HEADER (MTSHM_SEALS_TABLE | F_SEAL_FUTURE_WRITE)

/*
 * Every layout value a reader uses, copied once from a validated header
 * into private memory. Addresses are computed from this copy only.
 */
struct mtshm_layout {
	uint32_t slot_count;
	uint32_t lane_count;
	uint32_t slot_stride;
	uint64_t table_size; /* slot_count * slot_stride */
	uint64_t threshold;
	uint64_t generation;
};

/*
 * A mapped object. Plain struct: owned by the caller, closed with
 * mtshm_close(). `hdr` is set for a header, NULL for a slot table. `fd` is
 * the object's descriptor when the mapper kept it, else -1. `dev`/`ino`
 * identify the object (two mappings of one table have the same pair).
 */
struct mtshm_map {
	void *base;
	size_t size;
	uint64_t off; /* object offset mapped at base (a window), else 0 */
	size_t guard; /* inaccessible bytes reserved on each side of base */
	struct mtshm_header *hdr;
	int fd;
	uint64_t dev;
	uint64_t ino;
};

/* Parameters for mtshm_header_create(). */
struct mtshm_params {
	uint32_t slots;     /* >= 1, <= MTSHM_MAX_SLOTS */
	uint32_t lanes;     /* >= 1, <= MTSHM_MAX_LANES */
	uint64_t threshold; /* flush threshold, bytes, > 0 */
};

/*
 * Create a header object (memfd `label`), fill it in, map it read-write
 * and seal it (MTSHM_SEALS_HEADER). Everything is written before the
 * magic, which is stored with release order. out->fd is kept (read-write:
 * for the server only; hand workers mtshm_reopen_ro()'s). Returns 0 or
 * -errno (-EINVAL for bad params).
 */
int mtshm_header_create(const char *label, const struct mtshm_params *p,
                        struct mtshm_map *out);

/*
 * Create a slot table object (memfd `label`) of l->table_size zero bytes,
 * sealed (MTSHM_SEALS_TABLE), mapped read-write; out->fd is kept.
 * Returns 0 or -errno.
 */
int mtshm_table_create(const char *label, const struct mtshm_layout *l,
                       struct mtshm_map *out);

/*
 * Map object `fd` after checking that it carries at least `seals` (so it
 * cannot be resized under the mapping) and, when `size` is not 0, that it
 * is exactly `size` bytes. A header (seals include F_SEAL_FUTURE_WRITE) is
 * mapped read-only and validated; a table read-write. The descriptor is
 * not consumed: out->fd is -1 and the caller closes `fd`. Returns 0,
 * -errno, MTSHM_EUNSEALED or another MTSHM_E* code.
 */
int mtshm_map_fd(int fd, unsigned seals, uint64_t size, struct mtshm_map *out);

/*
 * Guard regions around a worker's slot window: 1 MiB of inaccessible
 * address space on each side, no memory. A program's own loop that runs
 * off the end or the start of one of its blocks, byte by byte or with any
 * stride below 1 MiB, faults in a guard before it can reach a slot.
 */
#define MTSHM_GUARD (UINT64_C(1) << 20)

/*
 * Map read-write only the page(s) of slot table `fd` that hold bytes
 * [off, off + len), between two PROT_NONE guards of `guard` bytes (rounded
 * up to pages) reserved with it: a worker maps its own slot this way, and
 * no other part of its uid's table. Checks seals and size as
 * mtshm_map_fd(). out->base is the first mapped page and out->off its
 * offset in the object, so byte `off` is at base + (off - out->off);
 * mtshm_close() releases the guards too. Returns 0, -errno,
 * MTSHM_EUNSEALED, MTSHM_ETRUNCATED or MTSHM_ELAYOUT (a range outside the
 * object).
 */
int mtshm_map_window(int fd, uint64_t size, uint64_t off, uint64_t len,
                     size_t guard, struct mtshm_map *out);

/* A read-only descriptor of the same object as `fd` (through
 * /proc/self/fd), close-on-exec. Returns it or -errno. */
int mtshm_reopen_ro(int fd);

/*
 * Check a header of `size` mapped bytes: magic (and byte order), version,
 * and a possible geometry. Returns 0 or an MTSHM_E* code. Never reads
 * beyond `size`.
 */
int mtshm_validate(const void *base, size_t size);

/* Validate the header at `base` and copy its layout into *out. Returns 0
 * or an MTSHM_E* code (then *out is zeroed). */
int mtshm_layout_read(const void *base, size_t size, struct mtshm_layout *out);

/* Unmap and close. Accepts NULL, a zeroed or an already closed map. */
void mtshm_close(struct mtshm_map *m);

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

/* Address of slot `i` in the table mapped at `table`, from a private
 * layout. The caller checked i < l->slot_count. */
static inline struct mtshm_slot_id *mtshm_slot(const struct mtshm_layout *l,
                                               void *table, uint32_t i)
{
	return (struct mtshm_slot_id *)((char *)table +
	                                (size_t)i * l->slot_stride);
}

/* Address of lane `k` of the slot whose identity is `s`. */
static inline struct mtshm_lane *mtshm_lane(struct mtshm_slot_id *s, uint32_t k)
{
	return (struct mtshm_lane *)((char *)s + (size_t)k * MTSHM_LINE +
	                             sizeof(struct mtshm_slot_id));
}

/*
 * Sum a slot's counters: lanes [0, min(lanes_used, lane_count)) plus
 * overflow, `lane_count` from the reader's private layout. Lock-free; see
 * the comment at the top for why a racing read is harmless.
 *
 * The lanes are added modulo 2^64, so one lane's value may run as far as
 * it likes (a producer thread's lane up, a consumer's down) and the total
 * is still exact; only a total beyond +/-MTSHM_ABSURD_BYTES sets *absurd
 * (and the sum is then not to be used).
 */
static inline int64_t mtshm_slot_sum(struct mtshm_slot_id *s,
                                     uint32_t lane_count, uint64_t *flushes,
                                     int *absurd)
{
	uint32_t used = mtshm_load_relaxed32(&s->lanes_used);
	if (used > lane_count)
		used = lane_count;
	uint64_t sum = (uint64_t)mtshm_load_relaxeds64(&s->overflow);
	uint64_t nf = 0;
	for (uint32_t k = 0; k < used; k++) {
		struct mtshm_lane *l = mtshm_lane(s, k);
		sum += (uint64_t)mtshm_load_relaxeds64(&l->bytes);
		nf += mtshm_load_relaxed64(&l->flushes);
	}
	/* Two's complement: the wrapped sum read as signed is the exact
	 * total whenever the true total fits, which a sane one does. */
	int64_t total =
	    sum <= (uint64_t)INT64_MAX ? (int64_t)sum : -(int64_t)(~sum) - 1;
	*flushes = nf;
	*absurd = total > MTSHM_ABSURD_BYTES || total < -MTSHM_ABSURD_BYTES;
	return total;
}

/*
 * The process's mapped bytes (lane 0's `mapped`, layout 2.1): an absolute
 * value the client stores, so one relaxed load is the whole read. *absurd
 * is set when it is negative or beyond MTSHM_ABSURD_BYTES (then it is not
 * to be used). In the line the slot's sum reads anyway.
 */
static inline uint64_t mtshm_slot_mapped(struct mtshm_slot_id *s, int *absurd)
{
	int64_t m = mtshm_load_relaxeds64(&mtshm_lane(s, 0)->mapped);
	*absurd = m < 0 || m > MTSHM_ABSURD_BYTES;
	return *absurd ? 0 : (uint64_t)m;
}

/*
 * Store a free-bytes sample (layout 2.2) into lane 0: `free_bytes` free at
 * heap `heap`. One writer at a time (the caller excludes the others): the
 * sequence is made odd while the pair changes, as for the fleet's
 * snapshot.
 */
static inline void mtshm_free_store(struct mtshm_slot_id *s, int64_t free_bytes,
                                    int64_t heap)
{
	struct mtshm_lane *l = mtshm_lane(s, 0);
	uint64_t seq = (mtshm_load_relaxed64(&l->free_seq) + 1) & ~UINT64_C(1);
	mtshm_store_relaxed64(&l->free_seq, seq + 1);
	mtshm_store_releases64(&l->free_bytes, free_bytes);
	mtshm_store_releases64(&l->free_heap, heap);
	mtshm_store_release64(&l->free_seq, seq + 2);
}

/*
 * What the reader of a slot's free-bytes samples remembers between them
 * (the server's, per process): the sample it last read whole, and the
 * bytes the allocator is taken to hold for the heap (in use or free)
 * since. All zero: nothing read yet.
 */
struct mtshm_free_held {
	uint64_t seq;  /* free_seq of that sample */
	uint64_t held; /* the sample's heap + free, raised by every larger
	                * heap seen since */
};

/*
 * The process's allocator's free bytes (layout 2.2) now, from the sample
 * in lane 0, `heap`, the slot's heap bytes this tick (its lanes and
 * overflow, clamped at 0), and `h`, the caller's memory of earlier calls
 * for this slot. Returns 1 and sets *out, 0 when no sample has been read
 * whole yet and a client is writing one (the caller keeps its last
 * value). *absurd: a sample that cannot be (negative, beyond
 * MTSHM_ABSURD_BYTES).
 *
 * The sample is free bytes F at heap H0: the allocator held H0 + F. Until
 * the next sample it is taken to hold that, or the largest heap seen
 * since if larger, and the free part is what of it the heap does not
 * use:
 * - the heap grew: first out of that free memory (had the allocator
 *   grown instead, the next sample says so);
 * - it shrank: what was freed since is counted as free. The allocator
 *   may have kept it (glibc's fast bins, jemalloc's dirty pages: still
 *   resident) or given it back; only the next sample can tell, and until
 *   then the figure errs high, never below what the process holds. (The
 *   other choice, scaling F with the heap, left a process that freed
 *   300 MiB of small blocks counted at nothing while the kernel still
 *   charged it the 300 MiB, until the next sample.)
 * A sample being written is not read: the last whole one stands.
 */
static inline int mtshm_free_now(struct mtshm_slot_id *s, uint64_t heap,
                                 struct mtshm_free_held *h, uint64_t *out,
                                 int *absurd)
{
	struct mtshm_lane *l = mtshm_lane(s, 0);
	*absurd = 0;
	uint64_t s1 = mtshm_load_acquire64(&l->free_seq);
	int64_t f = mtshm_load_acquires64(&l->free_bytes);
	int64_t h0 = mtshm_load_acquires64(&l->free_heap);
	uint64_t s2 = mtshm_load_relaxed64(&l->free_seq);
	if (!(s1 & 1) && s1 == s2 && s1 != h->seq) {
		if (f < 0 || f > MTSHM_ABSURD_BYTES ||
		    h0 < -MTSHM_ABSURD_BYTES || h0 > MTSHM_ABSURD_BYTES) {
			*absurd = 1;
			*out = 0;
			return 1;
		}
		/* Both below 2^50: no overflow. */
		h->held = (h0 < 0 ? 0 : (uint64_t)h0) + (uint64_t)f;
		h->seq = s1;
	} else if (h->seq == 0) {
		if (s1 != 0 || s2 != 0)
			return 0;
		*out = 0; /* never sampled */
		return 1;
	}
	if (heap > h->held)
		h->held = heap;
	*out = h->held - heap;
	return 1;
}

/*
 * Ask for a slot's first line (identity and lane 0: all a one-thread
 * process's counters) ahead of its sum. The tick visits slots in an order
 * the hardware prefetcher cannot guess, so it says which it will need a
 * few slots early and their misses overlap. A hint: never faults.
 */
static inline void mtshm_slot_prefetch(const struct mtshm_slot_id *s)
{
	const char *p = (const char *)s;
	/* The 48..127 bytes the sum reads span both 64-byte halves. */
	__builtin_prefetch(p + 48, 0, 3);
	__builtin_prefetch(p + 64, 0, 3);
}

#endif /* MEMTALLY_SHM_H */
