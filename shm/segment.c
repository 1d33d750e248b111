/*
 * segment.c - create, seal, validate and map memtally's shared objects.
 *
 * Invariants: an object is only ever mapped after its seals were checked
 * (it cannot shrink under a mapping, so no access inside the mapped size
 * can fault), and a header is only used after mtshm_validate() accepted
 * it; every reader then copies the layout into a private struct
 * mtshm_layout and never reads it back. The creator writes every field,
 * then the magic last with release order: a reader that sees the magic
 * sees the rest.
 */
#define _GNU_SOURCE
#include "mtshm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t new_generation(void)
{
	uint64_t g = 0;
	if (getrandom(&g, sizeof(g), GRND_NONBLOCK) != sizeof(g))
		g = realtime_ns() ^ ((uint64_t)getpid() << 32);
	return g ? g : 1;
}

static void map_reset(struct mtshm_map *m)
{
	memset(m, 0, sizeof(*m));
	m->fd = -1;
}

/* A memfd of `size` zero bytes, mapped read-write into *out (fd kept). */
static int memfd_new(const char *label, uint64_t size, struct mtshm_map *out)
{
	if (size == 0 || size > (uint64_t)SIZE_MAX / 2)
		return -EINVAL;
	int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (fd <= 2) {
		/* A process started with stdio closed: keep the object off
		 * 0..2 (mtshm_close() treats fd 0 as "none"). */
		int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
		close(fd);
		if (moved < 0)
			return -errno;
		fd = moved;
	}
	int err = 0;
	if (ftruncate(fd, (off_t)size) < 0) {
		err = -errno;
		goto fail;
	}
	void *base =
	    mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		err = -errno;
		goto fail;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		err = -errno;
		munmap(base, (size_t)size);
		goto fail;
	}
	out->base = base;
	out->size = (size_t)size;
	out->fd = fd;
	out->dev = st.st_dev;
	out->ino = st.st_ino;
	return 0;
fail:
	close(fd);
	return err;
}

int mtshm_header_create(const char *label, const struct mtshm_params *p,
                        struct mtshm_map *out)
{
	map_reset(out);
	if (!label || !p || p->slots < 1 || p->slots > MTSHM_MAX_SLOTS ||
	    p->lanes < 1 || p->lanes > MTSHM_MAX_LANES || p->threshold == 0)
		return -EINVAL;
	int err = memfd_new(label, MTSHM_HEADER_SIZE, out);
	if (err)
		return err;

	/* ftruncate gave zero pages; fill in the rest, magic last. */
	struct mtshm_header *h = out->base;
	uint32_t stride = p->lanes * MTSHM_LINE;
	h->version_major = MTSHM_VERSION_MAJOR;
	h->version_minor = MTSHM_VERSION_MINOR;
	h->compat_minor = MTSHM_COMPAT_MINOR;
	h->header_size = MTSHM_HEADER_SIZE;
	h->slot_stride = stride;
	h->slot_count = p->slots;
	h->lane_count = p->lanes;
	h->line_size = MTSHM_LINE;
	h->table_size = (uint64_t)p->slots * stride;
	h->generation = new_generation();
	h->server_pid = (uint32_t)getpid();
	h->server_uid = (uint32_t)getuid();
	h->created_ns = realtime_ns();
	h->threshold = p->threshold;
	mtshm_store_release64(&h->magic, MTSHM_MAGIC);

	/* From here on no new writable mapping of it can be made, by anyone;
	 * ours, made before, stays writable. */
	if (fcntl(out->fd, F_ADD_SEALS, MTSHM_SEALS_HEADER) < 0) {
		err = -errno;
		mtshm_close(out);
		return err;
	}
	out->hdr = h;
	return 0;
}

int mtshm_table_create(const char *label, const struct mtshm_layout *l,
                       struct mtshm_map *out)
{
	map_reset(out);
	if (!label || !l || l->slot_count < 1 || l->table_size == 0 ||
	    l->table_size != (uint64_t)l->slot_count * l->slot_stride)
		return -EINVAL;
	int err = memfd_new(label, l->table_size, out);
	if (err)
		return err;
	if (fcntl(out->fd, F_ADD_SEALS, MTSHM_SEALS_TABLE) < 0) {
		err = -errno;
		mtshm_close(out);
	}
	return err;
}

/* memfd_create's objects without MFD_HUGETLB are tmpfs files. */
#define MTSHM_TMPFS_MAGIC 0x01021994

/* Is `fd` an object sealed with at least `seals` and, when `size` is not
 * 0, exactly `size` bytes, of plain pages? Fills *st. A huge-page memfd
 * is refused: a mapping of it is rounded up to its page size (2 MiB past
 * a 4 KiB window would cover whatever follows the window's guard), and a
 * hole punched in it faults with SIGBUS once the pool is empty. */
static int object_check(int fd, unsigned seals, uint64_t size, struct stat *st)
{
	int have = fcntl(fd, F_GET_SEALS);
	if (have < 0)
		return errno == EINVAL ? MTSHM_EUNSEALED : -errno;
	if (((unsigned)have & seals) != seals)
		return MTSHM_EUNSEALED;
	if (fstat(fd, st) < 0)
		return -errno;
	if (!S_ISREG(st->st_mode) || st->st_size <= 0 ||
	    (size && (uint64_t)st->st_size != size))
		return MTSHM_ETRUNCATED;
	struct statfs sf;
	if (fstatfs(fd, &sf) < 0)
		return -errno;
	if ((unsigned long)sf.f_type != MTSHM_TMPFS_MAGIC)
		return MTSHM_EUNSEALED;
	return 0;
}

int mtshm_map_fd(int fd, unsigned seals, uint64_t size, struct mtshm_map *out)
{
	map_reset(out);
	struct stat st;
	int err = object_check(fd, seals, size, &st);
	if (err)
		return err;
	bool header = seals & F_SEAL_FUTURE_WRITE;
	size_t len = (size_t)st.st_size;
	void *base = mmap(NULL, len, PROT_READ | (header ? 0 : PROT_WRITE),
	                  MAP_SHARED, fd, 0);
	if (base == MAP_FAILED)
		return -errno;
	if (header) {
		err = mtshm_validate(base, len);
		if (err) {
			munmap(base, len);
			return err;
		}
		out->hdr = base;
	}
	out->base = base;
	out->size = len;
	out->dev = st.st_dev;
	out->ino = st.st_ino;
	return 0;
}

int mtshm_map_window(int fd, uint64_t size, uint64_t off, uint64_t len,
                     size_t guard, struct mtshm_map *out)
{
	map_reset(out);
	struct stat st;
	int err = object_check(fd, MTSHM_SEALS_TABLE, size, &st);
	if (err)
		return err;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	if (len == 0 || off > (uint64_t)st.st_size ||
	    len > (uint64_t)st.st_size - off)
		return MTSHM_ELAYOUT;
	uint64_t first = off & ~(page - 1);
	uint64_t span = ((off + len + page - 1) & ~(page - 1)) - first;
	guard = (size_t)((guard + page - 1) & ~(page - 1));
	if (span > SIZE_MAX / 4 || guard > SIZE_MAX / 4)
		return -ENOMEM;
	/* Reserve guard + window + guard as inaccessible address space (no
	 * memory, no commit charge), then put the window in its middle:
	 * nothing the program maps later can sit right against it. */
	size_t total = (size_t)span + 2 * guard;
	char *res = mmap(NULL, total, PROT_NONE,
	                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED)
		return -errno;
	void *base = mmap(res + guard, (size_t)span, PROT_READ | PROT_WRITE,
	                  MAP_SHARED | MAP_FIXED, fd, (off_t)first);
	if (base == MAP_FAILED) {
		err = -errno;
		munmap(res, total);
		return err;
	}
	out->base = base;
	out->size = (size_t)span;
	out->off = first;
	out->guard = guard;
	out->dev = st.st_dev;
	out->ino = st.st_ino;
	return 0;
}

int mtshm_reopen_ro(int fd)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	int ro = open(path, O_RDONLY | O_CLOEXEC);
	return ro < 0 ? -errno : ro;
}

/* Check a header already copied into aligned private memory; `size` is
 * how many bytes the object really has. */
static int validate_copy(const struct mtshm_header *h, size_t size)
{
	if (size < sizeof(uint64_t))
		return MTSHM_EBADMAGIC;
	if (h->magic == MTSHM_MAGIC_SWAPPED)
		return MTSHM_EBYTEORDER;
	if (h->magic != MTSHM_MAGIC)
		return MTSHM_EBADMAGIC;
	if (size < MTSHM_HEADER_SIZE)
		return MTSHM_ETRUNCATED;
	if (h->version_major != MTSHM_VERSION_MAJOR ||
	    h->compat_minor > MTSHM_VERSION_MINOR)
		return MTSHM_EVERSION;
	if (h->line_size != MTSHM_LINE || h->header_size != MTSHM_HEADER_SIZE ||
	    h->lane_count < 1 || h->lane_count > MTSHM_MAX_LANES ||
	    h->slot_stride < (uint64_t)h->lane_count * MTSHM_LINE ||
	    h->slot_stride % MTSHM_LINE || h->slot_count < 1 ||
	    h->slot_count > MTSHM_MAX_SLOTS ||
	    h->table_size != (uint64_t)h->slot_count * h->slot_stride)
		return MTSHM_ELAYOUT;
	return 0;
}

/* Copy what `base` holds of a header (at most one header) into *h, zero
 * the rest. Works on any alignment. No acquire is needed: a header is
 * complete before its descriptor is passed to anyone. */
static void header_copy(struct mtshm_header *h, const void *base, size_t size)
{
	memset(h, 0, sizeof(*h));
	memcpy(h, base, size < sizeof(*h) ? size : sizeof(*h));
}

int mtshm_validate(const void *base, size_t size)
{
	struct mtshm_header copy;
	header_copy(&copy, base, size);
	return validate_copy(&copy, size);
}

int mtshm_layout_read(const void *base, size_t size, struct mtshm_layout *out)
{
	memset(out, 0, sizeof(*out));
	/* Validate and copy from one snapshot of the fields. */
	struct mtshm_header copy;
	header_copy(&copy, base, size);
	int err = validate_copy(&copy, size);
	if (err)
		return err;
	out->slot_count = copy.slot_count;
	out->lane_count = copy.lane_count;
	out->slot_stride = copy.slot_stride;
	out->table_size = copy.table_size;
	out->threshold = copy.threshold;
	out->generation = copy.generation;
	return 0;
}

void mtshm_close(struct mtshm_map *m)
{
	if (!m)
		return;
	if (m->base)
		munmap((char *)m->base - m->guard, m->size + 2 * m->guard);
	if (m->fd > 0) /* 0: a zeroed map; objects are never on 0..2 */
		close(m->fd);
	map_reset(m);
}

const char *mtshm_strerror(int err)
{
	switch (err) {
	case 0:
		return "success";
	case MTSHM_EBADMAGIC:
		return "not a memtally segment (bad magic)";
	case MTSHM_EVERSION:
		return "memtally segment of an unsupported layout version";
	case MTSHM_ETRUNCATED:
		return "memtally segment smaller than its declared slots";
	case MTSHM_ELAYOUT:
		return "memtally segment with an impossible layout";
	case MTSHM_EBYTEORDER:
		return "memtally segment written with the other byte order";
	case MTSHM_EUNSEALED:
		return "memtally shared object not sealed against resizing";
	default:
		return err < 0 ? strerror(-err) : "unknown error";
	}
}

int mtshm_fleet_read(const struct mtshm_header *h, struct mtshm_fleet *out)
{
	const struct mtshm_fleet *f = &h->fleet;
	memset(out, 0, sizeof(*out));
	for (int i = 0; i < MTSHM_FLEET_READ_TRIES; i++) {
		uint64_t s = mtshm_load_acquire64(&f->seq);
		out->bytes = mtshm_load_acquire64(&f->bytes);
		out->peak = mtshm_load_acquire64(&f->peak);
		out->limit = mtshm_load_acquire64(&f->limit);
		out->reserved = mtshm_load_acquire64(&f->reserved);
		out->error_bytes = mtshm_load_acquire64(&f->error_bytes);
		out->heartbeat_ns = mtshm_load_acquire64(&f->heartbeat_ns);
		out->ticks = mtshm_load_acquire64(&f->ticks);
		out->state = mtshm_load_acquire32(&f->state);
		out->processes = mtshm_load_acquire32(&f->processes);
		out->unregistered = mtshm_load_acquire32(&f->unregistered);
		out->mapped = mtshm_load_acquire64(&f->mapped);
		out->allocator_free = mtshm_load_acquire64(&f->allocator_free);
		out->seq = s;
		if (!(s & 1) && s == mtshm_load_relaxed64(&f->seq))
			return 0;
	}
	return -EAGAIN;
}

void mtshm_fleet_publish(struct mtshm_header *h, const struct mtshm_fleet *in)
{
	struct mtshm_fleet *f = &h->fleet;
	uint64_t s = mtshm_load_relaxed64(&f->seq);
	mtshm_store_relaxed64(&f->seq, s + 1);
	mtshm_store_release64(&f->bytes, in->bytes);
	mtshm_store_release64(&f->peak, in->peak);
	mtshm_store_release64(&f->limit, in->limit);
	mtshm_store_release64(&f->reserved, in->reserved);
	mtshm_store_release64(&f->error_bytes, in->error_bytes);
	mtshm_store_release64(&f->heartbeat_ns, in->heartbeat_ns);
	mtshm_store_release64(&f->ticks, in->ticks);
	mtshm_store_release32(&f->state, in->state);
	mtshm_store_release32(&f->processes, in->processes);
	mtshm_store_release32(&f->unregistered, in->unregistered);
	mtshm_store_release64(&f->mapped, in->mapped);
	mtshm_store_release64(&f->allocator_free, in->allocator_free);
	mtshm_store_release64(&f->seq, s + 2);
}
