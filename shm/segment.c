/*
 * segment.c - create, open, validate and map a memtally segment.
 *
 * Invariants: a segment is only ever handed out after mtshm_validate()
 * accepted it, so every other piece of code may trust the published
 * geometry (slot_offset + slot_count * slot_stride <= mapped size). The
 * creator writes every field, then the magic last with release order: an
 * opener that sees the magic sees the rest.
 */
#define _GNU_SOURCE
#include "mtshm.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
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

int mtshm_create(const char *name, const struct mtshm_params *p,
		 struct mtshm_map *out)
{
	memset(out, 0, sizeof(*out));
	if (!name || name[0] != '/' || !p || p->slots < 1 ||
	    p->slots > MTSHM_MAX_SLOTS || p->lanes < 1 ||
	    p->lanes > MTSHM_MAX_LANES || p->threshold == 0)
		return -EINVAL;

	uint64_t stride = (uint64_t)p->lanes * MTSHM_LINE;
	uint64_t names = MTSHM_HEADER_SIZE + (uint64_t)p->slots * stride;
	uint64_t size = names + (uint64_t)p->slots * MTSHM_NAMES_STRIDE;
	if (names > UINT32_MAX)
		return -EINVAL; /* names_offset is 32 bits */

	/* Replace, never reuse: an old object may be of another layout, and
	 * an opener holding it keeps its own mapping of the old inode. */
	shm_unlink(name);
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
			  p->mode & 0777);
	if (fd < 0)
		return -errno;
	int err = 0;
	/* shm_open applies the umask; the mode is part of the contract. */
	if (fchmod(fd, p->mode & 0777) < 0 ||
	    (p->gid >= 0 && fchown(fd, (uid_t)-1, (gid_t)p->gid) < 0) ||
	    ftruncate(fd, (off_t)size) < 0) {
		err = -errno;
		goto fail_unlink;
	}
	void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		err = -errno;
		goto fail_unlink;
	}
	close(fd);

	/* ftruncate gave zero pages; fill in the rest, magic last. */
	struct mtshm_header *h = base;
	h->version_major = MTSHM_VERSION_MAJOR;
	h->version_minor = MTSHM_VERSION_MINOR;
	h->compat_minor = MTSHM_COMPAT_MINOR;
	h->header_size = MTSHM_HEADER_SIZE;
	h->slot_offset = MTSHM_HEADER_SIZE;
	h->slot_stride = (uint32_t)stride;
	h->slot_count = p->slots;
	h->lane_count = p->lanes;
	h->line_size = MTSHM_LINE;
	h->segment_size = size;
	h->generation = new_generation();
	h->server_pid = (uint32_t)getpid();
	h->server_uid = (uint32_t)getuid();
	h->created_ns = realtime_ns();
	h->threshold = p->threshold;
	h->names_offset = (uint32_t)names;
	h->names_stride = MTSHM_NAMES_STRIDE;
	mt_store_release64(&h->magic, MTSHM_MAGIC);

	out->base = base;
	out->size = size;
	out->hdr = h;
	return 0;

fail_unlink:
	close(fd);
	shm_unlink(name);
	return err;
}

int mtshm_validate(const void *base, size_t size)
{
	const struct mtshm_header *h = base;
	if (size < sizeof(uint64_t))
		return MTSHM_EBADMAGIC;
	uint64_t magic = mt_load_acquire64(&h->magic);
	if (magic == MTSHM_MAGIC_SWAPPED)
		return MTSHM_EBYTEORDER;
	if (magic != MTSHM_MAGIC)
		return MTSHM_EBADMAGIC;
	if (size < MTSHM_HEADER_SIZE)
		return MTSHM_ETRUNCATED;
	if (h->version_major != MTSHM_VERSION_MAJOR ||
	    h->compat_minor > MTSHM_VERSION_MINOR)
		return MTSHM_EVERSION;
	if (h->line_size != MTSHM_LINE || h->header_size < MTSHM_HEADER_SIZE ||
	    h->slot_offset < h->header_size || h->slot_offset % MTSHM_LINE ||
	    h->lane_count < 1 || h->lane_count > MTSHM_MAX_LANES ||
	    h->slot_stride < (uint64_t)h->lane_count * MTSHM_LINE ||
	    h->slot_stride % MTSHM_LINE || h->slot_count < 1 ||
	    h->slot_count > MTSHM_MAX_SLOTS)
		return MTSHM_ELAYOUT;
	uint64_t need =
		h->slot_offset + (uint64_t)h->slot_count * h->slot_stride;
	if (h->segment_size < need)
		return MTSHM_ELAYOUT;
	if (h->version_minor >= 1 && h->names_offset) {
		/* (1.1) The names region lies after the slots and fits. */
		uint64_t end = h->names_offset +
			       (uint64_t)h->slot_count * h->names_stride;
		if (h->names_offset < need || h->names_offset % 64 ||
		    h->names_stride < sizeof(struct mtshm_slot_names) ||
		    h->names_stride % 64 || h->segment_size < end)
			return MTSHM_ELAYOUT;
		need = end;
	}
	if (size < need)
		return MTSHM_ETRUNCATED;
	return 0;
}

int mtshm_open(const char *name, int writable, struct mtshm_map *out)
{
	memset(out, 0, sizeof(*out));
	if (!name || name[0] != '/')
		return -EINVAL;
	int fd = shm_open(name, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct stat st;
	int err = 0;
	if (fstat(fd, &st) < 0) {
		err = -errno;
		goto fail_close;
	}
	if (st.st_size < (off_t)sizeof(uint64_t)) {
		err = MTSHM_EBADMAGIC;
		goto fail_close;
	}
	size_t size = (size_t)st.st_size;
	void *base = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0),
			  MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		err = -errno;
		goto fail_close;
	}
	close(fd);
	err = mtshm_validate(base, size);
	if (err) {
		munmap(base, size);
		return err;
	}
	out->base = base;
	out->size = size;
	out->hdr = base;
	return 0;

fail_close:
	close(fd);
	return err;
}

void mtshm_close(struct mtshm_map *m)
{
	if (m && m->base)
		munmap(m->base, m->size);
	if (m)
		memset(m, 0, sizeof(*m));
}

int mtshm_unlink(const char *name)
{
	return shm_unlink(name) < 0 ? -errno : 0;
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
	default:
		return err < 0 ? strerror(-err) : "unknown error";
	}
}

int mtshm_fleet_read(const struct mtshm_header *h, struct mtshm_fleet *out)
{
	const struct mtshm_fleet *f = &h->fleet;
	for (int i = 0; i < MTSHM_FLEET_READ_TRIES; i++) {
		uint64_t s = mt_load_acquire64(&f->seq);
		out->bytes = mt_load_acquire64(&f->bytes);
		out->peak = mt_load_acquire64(&f->peak);
		out->limit = mt_load_acquire64(&f->limit);
		out->reserved = mt_load_acquire64(&f->reserved);
		out->error_bytes = mt_load_acquire64(&f->error_bytes);
		out->heartbeat_ns = mt_load_acquire64(&f->heartbeat_ns);
		out->ticks = mt_load_acquire64(&f->ticks);
		out->state = mt_load_acquire32(&f->state);
		out->processes = mt_load_acquire32(&f->processes);
		out->unregistered = mt_load_acquire32(&f->unregistered);
		out->seq = s;
		if (!(s & 1) && s == mt_load_relaxed64(&f->seq))
			return 0;
	}
	return -EAGAIN;
}

void mtshm_fleet_publish(struct mtshm_header *h, const struct mtshm_fleet *in)
{
	struct mtshm_fleet *f = &h->fleet;
	uint64_t s = mt_load_relaxed64(&f->seq);
	mt_store_relaxed64(&f->seq, s + 1);
	mt_store_release64(&f->bytes, in->bytes);
	mt_store_release64(&f->peak, in->peak);
	mt_store_release64(&f->limit, in->limit);
	mt_store_release64(&f->reserved, in->reserved);
	mt_store_release64(&f->error_bytes, in->error_bytes);
	mt_store_release64(&f->heartbeat_ns, in->heartbeat_ns);
	mt_store_release64(&f->ticks, in->ticks);
	mt_store_release32(&f->state, in->state);
	mt_store_release32(&f->processes, in->processes);
	mt_store_release32(&f->unregistered, in->unregistered);
	mt_store_release64(&f->seq, s + 2);
}

int64_t mtshm_slot_sum(const struct mtshm_map *m, struct mtshm_slot_id *s,
		       uint64_t *flushes, int *absurd)
{
	uint64_t nf;
	int bad;
	int64_t sum = mtshm_slot_sum_inline(s, m->hdr->lane_count, &nf, &bad);
	if (flushes)
		*flushes = nf;
	if (absurd)
		*absurd = bad;
	return sum;
}
