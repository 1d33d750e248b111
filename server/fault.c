/*
 * fault.c - a SIGBUS in a slot table is a page memtallyd cannot read, not
 * its end.
 *
 * The handler runs on whichever thread touched the page, at any point of
 * its code, so it only reads atomics and makes one mmap: it looks the
 * address up among the watched ranges, takes a free spare (a bit of
 * `spares_used`, or the shared last one when all are taken), and maps it
 * MAP_SHARED | MAP_FIXED over the page. The spares are pages of a memfd
 * of memtallyd's own, allocated at start: mapping one charges no commit
 * and allocates nothing, which is what the failed access could not do.
 * The access is then made again, on the spare, and reads what memtallyd
 * itself last wrote there (zeros, for a fresh spare). A SIGBUS anywhere
 * else is not ours: the previous disposition is put back and the access,
 * made again, meets it.
 *
 * The loop learns of it by the count (mts_fault_count) and finds which
 * pages are spares by /proc/self/maps (mts_fault_scan), so the handler
 * keeps no list. A page is mapped back onto its table when a slot on it
 * is handed out again, or its process starts a new image, or once a
 * second until then (mts_fault_restore), after the registry allocated
 * it.
 *
 * Only the loop thread touches the tables (the RSS thread reads /proc,
 * the thread pool writes records), so the handler answers a fault of the
 * loop thread, never while that thread watches, unwatches or restores a
 * range. A thread that read a table while the loop unmapped it could
 * have a spare mapped over an address already reused.
 */

#include "mts_fault.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

struct range {
	_Atomic uintptr_t base; /* 0: free */
	_Atomic uintptr_t len;
};

static struct range *ranges;
static uint32_t nranges;
static _Atomic uint32_t ranges_high; /* entries [0, high) may be in use */
static int spare_fd = -1;
static unsigned char *spare_map; /* our own view of the spares, to zero them */
static uint64_t spare_dev, spare_ino;
static uintptr_t page_size;
static _Atomic uint32_t spares_used; /* bit i: spare i is mapped somewhere */
static _Atomic uintptr_t spare_at[MTS_FAULT_SPARES]; /* its page, or 0 */
static _Atomic uint64_t faults;
static struct sigaction old_bus;
static _Atomic bool installed;

_Static_assert(MTS_FAULT_SPARES <= 32, "spares_used is 32 bits");

static bool watched(uintptr_t a)
{
	uint32_t high =
	    atomic_load_explicit(&ranges_high, memory_order_acquire);
	for (uint32_t i = 0; i < high; i++) {
		uintptr_t b =
		    atomic_load_explicit(&ranges[i].base, memory_order_acquire);
		if (b && a >= b &&
		    a - b < atomic_load_explicit(&ranges[i].len,
		                                 memory_order_relaxed))
			return true;
	}
	return false;
}

/* A free spare's index, marked used; the last one (shared) when none is
 * free. */
static uint32_t spare_take(void)
{
	uint32_t used = atomic_load(&spares_used);
	for (;;) {
		uint32_t free_bits =
		    ~used & ((1u << (MTS_FAULT_SPARES - 1)) - 1u);
		if (!free_bits)
			return MTS_FAULT_SPARES - 1;
		uint32_t i = (uint32_t)__builtin_ctz(free_bits);
		if (atomic_compare_exchange_weak(&spares_used, &used,
		                                 used | (1u << i)))
			return i;
	}
}

static int replace(uintptr_t a)
{
	if (spare_fd < 0 || !watched(a))
		return -EFAULT;
	uintptr_t page = a & ~(page_size - 1);
	uint32_t i = spare_take();
	void *m = mmap((void *)page, page_size, PROT_READ | PROT_WRITE,
	               MAP_SHARED | MAP_FIXED, spare_fd,
	               (off_t)((uintptr_t)i * page_size));
	if (m == MAP_FAILED) {
		int e = errno;
		if (i < MTS_FAULT_SPARES - 1)
			atomic_fetch_and(&spares_used, ~(1u << i));
		return -e;
	}
	if (i < MTS_FAULT_SPARES - 1)
		atomic_store(&spare_at[i], page);
	atomic_fetch_add(&faults, 1);
	return 0;
}

static void on_bus(int sig, siginfo_t *si, void *ctx)
{
	(void)ctx;
	int saved = errno;
	/* A fault the kernel raised has a positive si_code and the address
	 * in si_addr; one sent with kill() or sigqueue() has neither, and
	 * is not made again on return: it meets the disposition we found,
	 * now (for the default one, the end of the process, as before). */
	if (si->si_code <= 0) {
		sigaction(sig, &old_bus, NULL);
		raise(sig);
	} else if (replace((uintptr_t)si->si_addr) < 0) {
		sigaction(sig, &old_bus, NULL); /* not ours: as before us */
	}
	errno = saved;
}

int mts_fault_init(uint32_t max_ranges)
{
	if (atomic_load(&installed))
		return 0;
	long ps = sysconf(_SC_PAGESIZE);
	page_size = ps > 0 ? (uintptr_t)ps : 4096u;
	size_t bytes = (size_t)MTS_FAULT_SPARES * page_size;
	int fd = memfd_create("memtallyd-spares", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	int err = 0;
	/* Allocated now: a fault later must not need memory. */
	if (ftruncate(fd, (off_t)bytes) < 0 ||
	    fallocate(fd, 0, 0, (off_t)bytes) < 0 || fstat(fd, &st) < 0)
		err = -errno;
	void *m =
	    err ? MAP_FAILED
	        : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (!err && m == MAP_FAILED)
		err = -errno;
	struct range *r =
	    err ? NULL : calloc(max_ranges ? max_ranges : 1, sizeof(*r));
	if (!err && !r)
		err = -ENOMEM;
	if (err) {
		if (m != MAP_FAILED)
			munmap(m, bytes);
		close(fd);
		return err;
	}
	ranges = r;
	nranges = max_ranges ? max_ranges : 1;
	spare_fd = fd;
	spare_map = m;
	spare_dev = st.st_dev;
	spare_ino = st.st_ino;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_bus;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &old_bus) < 0)
		return -errno;
	atomic_store(&installed, true);
	return 0;
}

int mts_fault_watch(void *base, size_t len)
{
	if (!atomic_load(&installed) || !base || !len)
		return 0;
	for (uint32_t i = 0; i < nranges; i++) {
		if (atomic_load(&ranges[i].base))
			continue;
		/* A mapping covers whole pages, the table's size or not. */
		atomic_store(&ranges[i].len, ((uintptr_t)len + page_size - 1) &
		                                 ~(page_size - 1));
		atomic_store_explicit(&ranges[i].base, (uintptr_t)base,
		                      memory_order_release);
		if (i >= atomic_load(&ranges_high))
			atomic_store_explicit(&ranges_high, i + 1,
			                      memory_order_release);
		return 0;
	}
	return -ENOSPC;
}

void mts_fault_unwatch(void *base)
{
	if (!atomic_load(&installed) || !base)
		return;
	uintptr_t b = (uintptr_t)base;
	uint32_t high = atomic_load(&ranges_high);
	for (uint32_t i = 0; i < high; i++) {
		if (atomic_load(&ranges[i].base) != b)
			continue;
		size_t len = atomic_load(&ranges[i].len);
		atomic_store(&ranges[i].base, 0);
		/* Its spares are free again once the mapping goes. */
		for (uint32_t k = 0; k < MTS_FAULT_SPARES - 1; k++) {
			uintptr_t at = atomic_load(&spare_at[k]);
			if (at && at >= b && at - b < len) {
				memset(spare_map + (size_t)k * page_size, 0,
				       page_size);
				atomic_store(&spare_at[k], 0);
				atomic_fetch_and(&spares_used, ~(1u << k));
			}
		}
	}
}

uint64_t mts_fault_count(void)
{
	return atomic_load_explicit(&faults, memory_order_relaxed);
}

/* One line of /proc/self/maps: a part of [lo, hi) a spare stands in for,
 * clipped to it (the kernel merges the spares of two tables that meet,
 * their offsets running on), to fn. Our own view of the spares is not a
 * table's. */
static void scan_line(const char *line, uintptr_t lo, uintptr_t hi,
                      void (*fn)(void *, void *, size_t), void *arg)
{
	unsigned long start, end, off, ino;
	unsigned maj, mnr;
	if (sscanf(line, "%lx-%lx %*s %lx %x:%x %lu", &start, &end, &off, &maj,
	           &mnr, &ino) != 6)
		return;
	uintptr_t own = (uintptr_t)spare_map;
	size_t bytes = (size_t)MTS_FAULT_SPARES * page_size;
	if (ino != spare_ino || makedev(maj, mnr) != spare_dev ||
	    off >= bytes || (start >= own && start < own + bytes) ||
	    !strstr(line, "memtallyd-spares"))
		return;
	if (start < lo)
		start = lo;
	if (end > hi)
		end = hi;
	if (start < end)
		fn(arg, (void *)start, (size_t)(end - start));
}

int mts_fault_scan(void *base, size_t len,
                   void (*fn)(void *arg, void *addr, size_t bytes), void *arg)
{
	if (!atomic_load(&installed))
		return 0;
	/* read(2) into the stack, not stdio: this runs when the machine
	 * had no page to spare a moment ago. */
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	/* A mapping covers whole pages, the table's size or not. */
	uintptr_t lo = (uintptr_t)base;
	uintptr_t hi = (lo + len + page_size - 1) & ~(page_size - 1);
	char buf[4096];
	size_t have = 0;
	int err = 0;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err = -errno;
			break;
		}
		have += (size_t)n;
		buf[have] = 0;
		char *p = buf, *nl;
		while ((nl = strchr(p, '\n'))) {
			*nl = 0;
			scan_line(p, lo, hi, fn, arg);
			p = nl + 1;
		}
		have = (size_t)(buf + have - p);
		memmove(buf, p, have);
		if (n == 0 || have == sizeof(buf) - 1) {
			if (have) { /* a last line without its newline */
				buf[have] = 0;
				scan_line(buf, lo, hi, fn, arg);
			}
			if (n == 0)
				break;
			have = 0; /* a line longer than the buffer: a path */
		}
	}
	close(fd);
	return err;
}

int mts_fault_restore(void *addr, int fd, uint64_t off)
{
	if (!atomic_load(&installed))
		return 0;
	uintptr_t page = (uintptr_t)addr & ~(page_size - 1);
	if (mmap((void *)page, page_size, PROT_READ | PROT_WRITE,
	         MAP_SHARED | MAP_FIXED, fd, (off_t)off) == MAP_FAILED)
		return -errno;
	for (uint32_t k = 0; k < MTS_FAULT_SPARES - 1; k++) {
		if (atomic_load(&spare_at[k]) != page)
			continue;
		/* Zeroed before it is free: the next page it stands for
		 * reads nothing of this one. */
		memset(spare_map + (size_t)k * page_size, 0, page_size);
		atomic_store(&spare_at[k], 0);
		atomic_fetch_and(&spares_used, ~(1u << k));
	}
	return 0;
}

int mts_fault_replace(void *addr)
{
	if (!atomic_load(&installed))
		return -ENXIO;
	return replace((uintptr_t)addr);
}
