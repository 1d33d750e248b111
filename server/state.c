/*
 * state.c - the restart record: what a memtallyd that is killed and started
 * again needs to adopt the workers of the one before, without trusting
 * anything another process could write.
 *
 * Shared memory cannot carry it. Every byte a worker can write is a byte a
 * worker can forge, and a forged record naming an unrelated process would
 * make that process a target of enforcement signals. So the record is a
 * plain file only the server's uid can write:
 *
 *   offset  size
 *        0  4096  struct state_hdr (magic, version, geometry, instance)
 *     4096   256  slot 0's struct mts_state_rec
 *      ...        one record per slot
 *
 * mts_state_open refuses any file it did not make. It opens the file with
 * O_NOFOLLOW. The file must be a regular file owned by our uid, with no
 * other link, not writable by group or others, and with our magic.
 * Anything else is unlinked and replaced, so a pre-created file cannot be
 * adopted. Where we may not unlink it, the server runs without a record
 * and says so. An flock() held for the server's life marks it live.
 *
 * Records are written with pwrite() as workers register. That is one
 * system call beside the several a registration already costs. An exit
 * writes nothing, because a restarted server drops entries whose process
 * is gone. Records are read with pread(), so a truncated file reads as
 * free records, never a fault.
 */
#include "mts_state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mts_defs.h"
#include "mts_log.h"
#include "mtshm.h"

#define STATE_MAGIC   UINT64_C(0x3174617453544d4d) /* "MMTStat1" */
#define STATE_VERSION 2u /* 2: whole names (records of 1024 bytes) */
#define STATE_HDR     4096u
#define REC_CHECK     UINT64_C(0x6d656d74616c6c79)

struct state_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t slots;
	uint32_t lanes;
	uint32_t spare0;
	uint64_t threshold;
	uint64_t instance;
};

struct mts_state {
	int fd;
	uint32_t slots;
	bool write_failed; /* logged once */
};

static uint64_t rec_check(uint32_t pid, uint32_t slot)
{
	return REC_CHECK ^ ((uint64_t)pid << 32) ^ slot;
}

/* Is the file open on `fd` one we made and nobody else can write? */
const char *mts_file_not_ours(int fd)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return "cannot stat it";
	if (!S_ISREG(st.st_mode))
		return "not a regular file";
	if (st.st_uid != geteuid())
		return "owned by another user";
	if (st.st_nlink != 1)
		return "has other links";
	if (st.st_mode & 022)
		return "writable by group or others";
	return NULL;
}

static bool state_file_ok(int fd, const char *path)
{
	char q[MTS_LOGQ_MAX];
	const char *why = mts_file_not_ours(fd);
	if (why)
		mts_log(MTS_LOG_WARN, "state file refused, not adopting it",
		        "path=%s why=\"%s\"", mts_logq(q, sizeof(q), path),
		        why);
	return why == NULL;
}

static int state_init(int fd, const struct mts_state_info *info)
{
	/* Empty it first: records of another geometry must not survive. */
	if (ftruncate(fd, 0) < 0)
		return -errno;
	uint8_t page[STATE_HDR] = {0};
	struct state_hdr h = {
	    .magic = STATE_MAGIC,
	    .version = STATE_VERSION,
	    .slots = info->slots,
	    .lanes = info->lanes,
	    .threshold = info->threshold,
	    .instance = info->instance,
	};
	memcpy(page, &h, sizeof(h));
	if (pwrite(fd, page, sizeof(page), 0) != (ssize_t)sizeof(page))
		return -EIO;
	off_t size = STATE_HDR + (off_t)info->slots * MTS_STATE_REC_SIZE;
	if (ftruncate(fd, size) < 0)
		return -errno;
	return 0;
}

/* An instance id for a record made afresh, unless the caller gave one. */
static void new_instance(struct mts_state_info *info)
{
	if (!info->instance &&
	    getrandom(&info->instance, sizeof(info->instance), 0) !=
	        sizeof(info->instance))
		info->instance = mts_now_realtime() ^ (uint64_t)getpid();
}

int mts_state_reset(struct mts_state *st, struct mts_state_info *info)
{
	new_instance(info);
	int err = state_init(st->fd, info);
	if (err == 0)
		st->slots = info->slots;
	return err;
}

int mts_state_open(const char *path, bool reset, struct mts_state_info *info,
                   bool *adopt, struct mts_state **out)
{
	char q[MTS_LOGQ_MAX];
	*adopt = false;
	*out = NULL;
	new_instance(info);
	/* Non-blocking: a file under another's lease must not hold the
	 * start for the lease break (45 s). */
	int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	bool fresh = false;
	if (fd >= 0 && !state_file_ok(fd, path)) {
		close(fd);
		fd = -1;
		/* Replace it: a file we did not make is never written. */
		if (unlink(path) == 0)
			errno = ENOENT; /* gone: made afresh below */
		else if (errno != ENOENT) {
			mts_log(MTS_LOG_WARN,
			        "cannot replace the state file: running "
			        "without a restart record (a restart will not "
			        "keep live workers' counts until they "
			        "re-register)",
			        "path=%s err=%s", mts_logq(q, sizeof(q), path),
			        strerror(errno));
			return 0;
		}
	}
	if (fd < 0) {
		/* Something in its place that is no file of ours (a
		 * directory, a socket, a leased file): the record is a
		 * convenience, memtallyd runs without it. */
		if (errno != ENOENT && errno != ELOOP && errno != EACCES &&
		    errno != EPERM) {
			mts_log(MTS_LOG_WARN,
			        "cannot open the state file: running without a "
			        "restart record",
			        "path=%s err=%s", mts_logq(q, sizeof(q), path),
			        strerror(errno));
			return 0;
		}
		if (errno == ELOOP) {
			/* A symlink: never followed, and said, as every
			 * other file of someone else's making is. */
			mts_log(MTS_LOG_WARN,
			        "state file refused, not adopting it",
			        "path=%s why=\"a symlink\"",
			        mts_logq(q, sizeof(q), path));
			unlink(path);
		}
		fd = open(path,
		          O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK |
		              O_CLOEXEC,
		          0600);
		if (fd < 0) {
			mts_log(MTS_LOG_WARN,
			        "cannot create the state file: running without "
			        "a restart record",
			        "path=%s err=%s", mts_logq(q, sizeof(q), path),
			        strerror(errno));
			return 0;
		}
		fresh = true;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int err = errno == EWOULDBLOCK ? -EBUSY : -errno;
		close(fd);
		return err;
	}
	struct state_hdr h;
	bool valid = !fresh && pread(fd, &h, sizeof(h), 0) == sizeof(h) &&
	             h.magic == STATE_MAGIC && h.version == STATE_VERSION &&
	             h.slots >= 1 && h.slots <= MTSHM_MAX_SLOTS &&
	             h.lanes >= 1 && h.lanes <= MTSHM_MAX_LANES &&
	             h.threshold > 0;
	if (valid && !reset) {
		info->slots = h.slots;
		info->lanes = h.lanes;
		info->threshold = h.threshold;
		info->instance = h.instance;
		*adopt = true;
	} else {
		if (!fresh && !valid)
			mts_log(MTS_LOG_WARN,
			        "state file of another format, starting afresh",
			        "path=%s", mts_logq(q, sizeof(q), path));
		int err = state_init(fd, info);
		if (err < 0) {
			/* A full disk: as without the file. */
			close(fd);
			mts_log(
			    MTS_LOG_WARN,
			    "cannot write the state file: running without a "
			    "restart record",
			    "path=%s err=%s", mts_logq(q, sizeof(q), path),
			    strerror(-err));
			return 0;
		}
	}
	struct mts_state *st = calloc(1, sizeof(*st));
	if (!st) {
		close(fd);
		return -ENOMEM;
	}
	st->fd = fd;
	st->slots = info->slots;
	*out = st;
	return 0;
}

static int state_write(struct mts_state *st, uint32_t slot, const void *buf,
                       size_t len)
{
	off_t off = STATE_HDR + (off_t)slot * MTS_STATE_REC_SIZE;
	ssize_t n = pwrite(st->fd, buf, len, off);
	if (n == (ssize_t)len)
		return 0;
	int err = n < 0 ? -errno : -EIO;
	if (!st->write_failed)
		mts_log(MTS_LOG_WARN,
		        "cannot write the state file: a restart may not keep "
		        "every live worker",
		        "err=%s", strerror(-err));
	st->write_failed = true;
	return err;
}

int mts_state_put(struct mts_state *st, uint32_t slot, struct mts_state_rec *r)
{
	if (!st || slot >= st->slots)
		return -EINVAL;
	r->check = rec_check(r->pid, slot);
	return state_write(st, slot, r, sizeof(*r));
}

void mts_state_clear(struct mts_state *st, uint32_t slot)
{
	if (!st || slot >= st->slots)
		return;
	struct mts_state_rec r;
	memset(&r, 0, sizeof(r));
	state_write(st, slot, &r, sizeof(r));
}

int mts_state_get(struct mts_state *st, uint32_t slot,
                  struct mts_state_rec *rec)
{
	if (!st || slot >= st->slots)
		return -ENOENT;
	off_t off = STATE_HDR + (off_t)slot * MTS_STATE_REC_SIZE;
	if (pread(st->fd, rec, sizeof(*rec), off) != (ssize_t)sizeof(*rec) ||
	    rec->pid == 0 || rec->check != rec_check(rec->pid, slot))
		return -ENOENT;
	/* Ours, but still read as untrusted text. */
	rec->group[sizeof(rec->group) - 1] = 0;
	rec->task[sizeof(rec->task) - 1] = 0;
	return 0;
}

void mts_state_close(struct mts_state *st)
{
	if (!st)
		return;
	close(st->fd); /* releases the lock */
	free(st);
}
