/*
 * mmap.c - anonymous memory a program maps itself: mmap, mmap64, mremap,
 * munmap, mprotect and madvise, interposed by the preloads.
 *
 * Runtimes keep their heaps on mappings they make themselves (CPython's
 * pymalloc arenas, GCC's GGC pages, custom arenas, a JVM's committed heap):
 * a malloc interposer never sees them. This front end counts them, in
 * their own figure (`mapped`, lane 0 of the slot, mtshm.h), beside the heap
 * bytes the malloc front end counts.
 *
 * What counts: a private, anonymous, writable mapping the program asked
 * for (MAP_PRIVATE | MAP_ANONYMOUS, PROT_WRITE), not MAP_NORESERVE: the
 * mappings the kernel charges to the commit limit.
 * Not counted: shared or file mappings (page cache), PROT_NONE
 * reservations, MAP_NORESERVE, and the mappings of the allocators memtally
 * already counts through malloc.
 * glibc's malloc calls its internal mmap directly, never this one.
 * libjemalloc.so.2 calls mmap and munmap through its PLT, so a call whose
 * return address lies in jemalloc's code, or in the preload's own (its
 * shared memory; a jemalloc linked into it), goes straight to the kernel,
 * uncounted, without a lock.
 *
 * Reservations: runtimes reserve address space as a private anonymous
 * mapping without write access (PROT_NONE, often MAP_NORESERVE) and
 * commit pieces of it with mprotect (V8, .NET) or with mmap(MAP_FIXED)
 * (HotSpot: that is an mmap like any other). Such a mapping made through
 * this mmap is kept in a second table, `r`.
 * An mprotect that makes part of it writable counts that part.
 * One that takes all access away (PROT_NONE) uncounts it: V8 and .NET
 * decommit that way.
 * Read-only or read-execute changes nothing (a JIT's W^X flips).
 * mprotect of any other memory (a writable mapping made read-only, a
 * guard page, code) changes nothing: a mapping counted at mmap stays
 * counted until it is unmapped.
 *
 * Resident, not committed: runtimes commit far more than they touch, and
 * give pages back without unmapping them. The figure is the counted
 * ranges `t` less `d`, the pages of them known not resident: madvise
 * (DONTNEED, FREE, REMOVE, PAGEOUT) adds to `d` at once, and a reconcile
 * (the pagemap scan over `t`, or mincore where the kernel has no scan)
 * rebuilds it, so pages touched again come back.
 * Ranges mapped lately (`y`) stay counted in full for one to two
 * seconds, as a malloc'd block counts before it is touched; a commit over
 * a reservation (mmap MAP_FIXED: HotSpot, Go) counts as it is touched.
 *
 * Invariants:
 *  - d is a subset of t, so the figure t.total - d.total is never below
 *    0, and an uncommit takes out only what was counted.
 *  - Counted once, uncounted exactly once: the counted ranges are kept in
 *    a per-process table (maptable.h), page-granular, so munmap or mremap
 *    of any part subtracts just the part that was counted.
 *  - The table changes under one mutex, held across the system call of
 *    the operation: the kernel serialises mmap, munmap and mremap of one
 *    process on its mmap lock anyway, so this costs no parallelism, and an
 *    address freed by one thread's munmap cannot be handed to another
 *    thread's mmap and inserted before the first thread removed it. The
 *    total is published as an absolute value while the lock is held, so
 *    the last store is the last state.
 *  - A thread that re-enters (a signal handler mapping memory while its
 *    thread holds the lock) maps uncounted: never a deadlock. fork() takes
 *    no lock of ours (mm_child says why); a child that finds the lock
 *    held starts its table afresh.
 *  - No cost on malloc or free: nothing here is on those paths. The
 *    table's own memory comes from raw system calls.
 *  - Fail open: a table that cannot grow stops counting new regions; the
 *    program's calls behave exactly as the kernel's.
 */
#define _GNU_SOURCE
#include "client_internal.h"
#include "maptable.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MM_EXPORT      __attribute__((visibility("default")))
#define MM_MAX_EXCL    8
#define MM_INITIAL_CAP 512

static struct {
	pthread_mutex_t lock;
	struct mtc_maptable t; /* counted ranges */
	struct mtc_maptable r; /* reservations: counted while writable */
	/* Pages of `t` not counted because they are known not resident:
	 * given back with madvise, or found so by the last reconcile. Always
	 * a subset of `t`; the figure is t.total - d.total. `d2` is the
	 * storage the next reconcile builds the new set in (then swapped). */
	struct mtc_maptable d, d2;
	/* Ranges counted lately (mapped, committed), in two generations of
	 * at least MM_YOUNG_NS each: a reconcile leaves them counted in full,
	 * untouched or not, as a malloc'd block counts before it is touched.
	 * y[0] is the generation begun at `y_at`. */
	struct mtc_maptable y[2];
	uint64_t y_at;
	/* Ranges advised MADV_DONTFORK: a fork's child does not have them
	 * (mm_child drops them from its tables). */
	struct mtc_maptable f;
	/* Reconcile (mincore over `t`): when the last one ran and how long
	 * it took, both CLOCK_MONOTONIC ns. */
	uint64_t rec_at, rec_cost;
	/* The pagemap scan refused (before 6.7, no /proc, a sandbox):
	 * mincore alone from then on, zero-page reads counted. */
	bool no_scan;
	/* Code ranges whose mmap calls are an allocator's or our own; set
	 * once by the constructor, before `ready`. */
	struct mtc_range excl[MM_MAX_EXCL];
	uint32_t nexcl;
	int ready; /* 1 once excl is complete (acquire/release) */
	uintptr_t page;
} mm = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread int mm_busy MTC_TLS; /* this thread holds mm.lock */
/* This thread is forking: from our prepare handler to our parent or child
 * handler, its calls pass the table by, uncounted, as a re-entered call
 * does (mm_child says why). */
static __thread int mm_in_fork MTC_TLS;

/* ---- the kernel's calls ------------------------------------------------ */

static void *sys_mmap(void *a, size_t len, int prot, int flags, int fd,
                      off_t off)
{
	return (void *)syscall(SYS_mmap, a, len, prot, flags, fd, off);
}

static int sys_munmap(void *a, size_t len)
{
	return (int)syscall(SYS_munmap, a, len);
}

static int sys_mprotect(void *a, size_t len, int prot)
{
	return (int)syscall(SYS_mprotect, a, len, prot);
}

static int sys_pkey_mprotect(void *a, size_t len, int prot, int pkey)
{
	return (int)syscall(SYS_pkey_mprotect, a, len, prot, pkey);
}

static int sys_madvise(void *a, size_t len, int advice)
{
	return (int)syscall(SYS_madvise, a, len, advice);
}

static int sys_mincore(uintptr_t a, size_t len, unsigned char *vec)
{
	return (int)syscall(SYS_mincore, (void *)a, len, vec);
}

/*
 * The pagemap scan (Linux 6.7, PAGEMAP_SCAN on /proc/self/pagemap), for
 * one thing mincore cannot tell: a page a program only read is mapped to
 * the kernel's shared zero page, "resident" to mincore, in no RssAnon.
 * Declared here: older C library headers lack it.
 */
struct mm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask;
	uint64_t return_mask;
};
struct mm_page_region {
	uint64_t start, end, categories;
};
#define MM_PAGEMAP_SCAN    _IOWR('f', 16, struct mm_scan_arg)
#define MM_PAGE_IS_PRESENT (1u << 3)
#define MM_PAGE_IS_PFNZERO (1u << 5)

static void *sys_mremap(void *old, size_t old_len, size_t new_len, int flags,
                        void *new_addr)
{
	return (void *)syscall(SYS_mremap, old, old_len, new_len, flags,
	                       new_addr);
}

/* The table's own storage: anonymous memory from the kernel directly. */
static int table_grow(struct mtc_maptable *t, size_t want)
{
	size_t cap = t->cap ? t->cap : MM_INITIAL_CAP;
	while (cap < want)
		cap *= 2;
	size_t bytes = cap * sizeof(struct mtc_range);
	void *p;
	if (t->v)
		p = sys_mremap(t->v, t->cap * sizeof(struct mtc_range), bytes,
		               MREMAP_MAYMOVE, NULL);
	else
		p = sys_mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -ENOMEM;
	t->v = p;
	t->cap = cap;
	return 0;
}

/* ---- who is calling ---------------------------------------------------- */

static int is_excluded(const void *ret)
{
	uintptr_t a = (uintptr_t)ret;
	for (uint32_t i = 0; i < mm.nexcl; i++)
		if (a >= mm.excl[i].lo && a < mm.excl[i].hi)
			return 1;
	return 0;
}

static int add_excl(struct dl_phdr_info *info, size_t size, void *self)
{
	(void)size;
	const char *name = info->dlpi_name ? info->dlpi_name : "";
	int ours = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && (uintptr_t)self >= lo &&
		    (uintptr_t)self < lo + ph->p_memsz)
			ours = 1;
	}
	if (!ours && !strstr(name, "libjemalloc"))
		return 0;
	for (int i = 0; i < info->dlpi_phnum && mm.nexcl < MM_MAX_EXCL; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		mm.excl[mm.nexcl++] = (struct mtc_range){lo, lo + ph->p_memsz};
	}
	return 0;
}

/* Its storage too: a fork in the middle of a grow (mremap moved it, `v`
 * not yet stored) or of the reconcile's swap of d and d2 leaves `v` and
 * `cap` wrong. The parent's storage is left to the child, unused. */
static void table_forget(struct mtc_maptable *t)
{
	t->v = NULL;
	t->n = 0;
	t->cap = 0;
	t->total = 0;
}

/*
 * fork() takes no lock of ours. Taken in a prepare handler, it was held
 * while the prepare handlers of libraries set up before ours ran (they run
 * after ours): a thread holding one of their locks and mapping memory
 * waited for ours while the forking thread waited for theirs, for ever (a
 * library whose allocator maps under its own lock, forked beside).
 * The child is one thread. The lock free there means no thread was inside
 * the table when the kernel copied it (a thread's stores reach the copy
 * in their order: one that finds its page already copied waits for the
 * fork to end), so the table is whole, as are the mappings. Held by a
 * thread the child does not have, the table may be half changed: the
 * child starts it afresh, and the mappings it inherited go uncounted (an
 * undercount, in a fork that met another thread's mmap). Held by this
 * thread (a fork from a signal handler that interrupted it in the table),
 * that code goes on after the handler and unlocks it.
 * The forking thread is marked from our prepare handler on (mm_in_fork):
 * the child handlers of libraries set up before ours run before this one,
 * and a call of theirs that maps would wait for a lock no thread of the
 * child will ever release; marked, it passes the table by, uncounted.
 */
static void mm_prepare(void)
{
	mm_in_fork = 1;
}

static void mm_parent(void)
{
	mm_in_fork = 0;
}

static void mm_forget(void)
{
	if (mm_busy)
		return;
	if (pthread_mutex_trylock(&mm.lock) == 0) {
		pthread_mutex_unlock(&mm.lock);
		return;
	}
	pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
	mm.lock = fresh;
	table_forget(&mm.t);
	table_forget(&mm.r);
	table_forget(&mm.d);
	table_forget(&mm.d2);
	table_forget(&mm.y[0]);
	table_forget(&mm.y[1]);
	table_forget(&mm.f);
	mtc_mapped_store(0);
}

static void dontfork_drop(void);

static void mm_child(void)
{
	mm_in_fork = 0;
	mm_forget();
	dontfork_drop();
	__atomic_store_n(&mtc_w.mm_seen, 1, __ATOMIC_RELEASE);
}

void mtc_mapped_forget(void)
{
	if (__atomic_load_n(&mm.ready, __ATOMIC_ACQUIRE))
		mm_forget();
	__atomic_store_n(&mtc_w.mm_seen, 1, __ATOMIC_RELEASE);
}

/* The table and its lock are this process's own: after mm_child in a
 * fork that ran our handlers (other libraries' child handlers that map
 * run before on_fork_child, and are counted as before), else once the
 * child of a fork that ran none was set up (mtc_fork_seen). */
static bool mm_fork_seen(void)
{
	if (__builtin_expect(
	        __atomic_load_n(&mtc_w.mm_seen, __ATOMIC_ACQUIRE) != 0, 1) ||
	    !mtc_wipe_on)
		return true;
	return mtc_fork_seen() &&
	       __atomic_load_n(&mtc_w.mm_seen, __ATOMIC_ACQUIRE) != 0;
}

/* Early: a constructor of its own, so the allocators' ranges are known
 * before most of the program runs (calls made earlier are not counted,
 * and so never uncounted). */
__attribute__((constructor(102))) static void mm_init(void)
{
	const char *off = getenv("MEMTALLY_MAPPED");
	const char *disabled = getenv("MEMTALLY_DISABLE");
	mm.page = (uintptr_t)sysconf(_SC_PAGESIZE);
	/* Counting of mapped memory switched off, or all of memtally: then
	 * no call takes the table's lock, as without memtally. */
	if ((off && off[0] == '0') || (disabled && disabled[0] == '1'))
		return;
	dl_iterate_phdr(add_excl, (void *)(uintptr_t)mm_init);
	mm.t.grow = table_grow;
	mm.r.grow = table_grow;
	mm.d.grow = table_grow;
	mm.d2.grow = table_grow;
	mm.y[0].grow = table_grow;
	mm.y[1].grow = table_grow;
	mm.f.grow = table_grow;
	pthread_atfork(mm_prepare, mm_parent, mm_child);
	__atomic_store_n(&mm.ready, 1, __ATOMIC_RELEASE);
}

/* The kernel ignores the descriptor of an anonymous mapping (some
 * programs pass 0), so neither do we. */
static inline int counted_kind(int prot, int flags)
{
	return (flags & MAP_ANONYMOUS) && (flags & MAP_TYPE) == MAP_PRIVATE &&
	       (prot & PROT_WRITE) && !(flags & MAP_NORESERVE);
}

/* A reservation: private and anonymous, but not writable (yet). */
static inline int reserved_kind(int prot, int flags)
{
	return (flags & MAP_ANONYMOUS) && (flags & MAP_TYPE) == MAP_PRIVATE &&
	       !(prot & PROT_WRITE);
}

static inline uintptr_t page_up(uintptr_t a)
{
	return (a + mm.page - 1) & ~(mm.page - 1);
}

/* Enter the table, or say no: not ready, excluded caller, or re-entry. */
static int enter(const void *ret)
{
	if (!__atomic_load_n(&mm.ready, __ATOMIC_ACQUIRE) || mm_busy ||
	    mm_in_fork || is_excluded(ret))
		return 0;
	/* In the child of a fork that ran no handler of ours, the lock may
	 * be held by a thread left behind: set up first (mm_fork_seen). */
	if (!mm_fork_seen())
		return 0;
	/* Busy before the lock: a signal landing between the lock's
	 * acquisition and this store would otherwise find the thread not
	 * busy and wait for the lock it holds itself. */
	mm_busy = 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	pthread_mutex_lock(&mm.lock);
	return 1;
}

/* The figure: the counted ranges less their pages known not resident. */
static inline uint64_t figure(void)
{
	return mm.t.total - mm.d.total;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- reconcile: the counted ranges against the kernel's resident pages -- */

/*
 * Pages given back (madvise) and touched again come back; pages the
 * program's runtime gave back behind our back (Go's madvise is a raw
 * system call; a committed heap never touched) leave. mincore(2) says, a
 * byte per page, which pages of a range are resident; a vector of
 * MM_VEC pages on the stack covers 16 MiB of 4 KiB pages per call. The
 * new set of pages not resident is built in `d2` (appended in address
 * order: no search, no moves) and swapped with `d`. A range mincore refuses (a
 * mapping removed behind our back) keeps its previous state. Under the
 * table's lock.
 */
#define MM_VEC 4096

/* How long a range counted lately stays counted in full, at least. */
#define MM_YOUNG_NS (1000u * 1000000u)

/* Bring the two generations up to `now`: one older after MM_YOUNG_NS,
 * both gone after twice that. Run before a range joins y[0] and before a
 * reconcile reads them, so that a range is young for more than
 * MM_YOUNG_NS and at most twice that, however long the process went
 * without a reconcile (a first one after an idle minute would otherwise
 * find a minute-old range in y[0] and keep it in full another second). */
static void young_age(uint64_t now)
{
	uint64_t age = now - mm.y_at;
	if (age < MM_YOUNG_NS)
		return;
	struct mtc_maptable old = mm.y[1];
	mm.y[1] = mm.y[0];
	mm.y[0] = old;
	mm.y[0].n = 0;
	mm.y[0].total = 0;
	if (age >= 2 * (uint64_t)MM_YOUNG_NS) {
		mm.y[1].n = 0;
		mm.y[1].total = 0;
	}
	mm.y_at = now;
}

static void young_add(uintptr_t lo, uintptr_t hi)
{
	young_age(now_ns());
	mtc_maptable_add(&mm.y[0], lo, hi);
}

/* The program gave pages back: whatever it does with them later, the
 * kernel's resident count says. */
static void young_remove(uintptr_t lo, uintptr_t hi)
{
	mtc_maptable_remove(&mm.y[0], lo, hi, NULL, 0, NULL);
	mtc_maptable_remove(&mm.y[1], lo, hi, NULL, 0, NULL);
}

/* In a fork's child, whose table is whole (the lock free): the ranges
 * advised MADV_DONTFORK are not in it, and stop being counted. */
static void dontfork_drop(void)
{
	if (mm_busy || __atomic_load_n(&mm.f.n, __ATOMIC_RELAXED) == 0 ||
	    pthread_mutex_trylock(&mm.lock) != 0)
		return;
	for (size_t i = 0; i < mm.f.n; i++) {
		uintptr_t lo = mm.f.v[i].lo, hi = mm.f.v[i].hi;
		mtc_maptable_remove(&mm.t, lo, hi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.r, lo, hi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.d, lo, hi, NULL, 0, NULL);
		young_remove(lo, hi);
	}
	mm.f.n = 0;
	mm.f.total = 0;
	mtc_mapped_store(figure());
	pthread_mutex_unlock(&mm.lock);
}

/* Pages [p, q) of vec[0..n) up to the next resident page: skip eight
 * resident pages at a time where possible (mincore sets bit 0 only). */
static size_t skip_resident(const unsigned char *vec, size_t p, size_t n)
{
	const uint64_t ones = UINT64_C(0x0101010101010101);
	while (p + 8 <= n) {
		uint64_t w;
		memcpy(&w, vec + p, 8);
		if ((w & ones) != ones)
			break;
		p += 8;
	}
	while (p < n && (vec[p] & 1))
		p++;
	return p;
}

static size_t skip_absent(const unsigned char *vec, size_t p, size_t n)
{
	const uint64_t ones = UINT64_C(0x0101010101010101);
	while (p + 8 <= n) {
		uint64_t w;
		memcpy(&w, vec + p, 8);
		if (w & ones)
			break;
		p += 8;
	}
	while (p < n && !(vec[p] & 1))
		p++;
	return p;
}

/* Append [lo, hi), which lies after all of d2, to d2: O(1), no search
 * (mtc_maptable_add would search and test for overlaps). No room: the
 * pages stay counted, as if resident. */
static void d2_append(uintptr_t lo, uintptr_t hi)
{
	struct mtc_maptable *t = &mm.d2;
	if (t->n && t->v[t->n - 1].hi == lo) {
		t->v[t->n - 1].hi = hi;
	} else {
		if (t->n == t->cap && (!t->grow || t->grow(t, t->n + 1) != 0))
			return;
		t->v[t->n++] = (struct mtc_range){lo, hi};
	}
	t->total += hi - lo;
}

/*
 * Where the kernel has the pagemap scan, one walk gives the pages of
 * [lo, hi) the process does not hold, as ranges: not present, or mapped
 * to the zero page (read, never written: "resident" to mincore, in no
 * RssAnon). They go to d2 as mincore's absent runs would. Returns false
 * (d2 as it was) where the scan fails: the caller falls back to mincore.
 */
/* The regions go in mincore's vector (buf, MM_VEC bytes, 8-aligned),
 * unused while the scan runs: one 4 KiB buffer on a stack that may be a
 * signal handler's. */
static bool scan_range(int pm, uintptr_t lo, uintptr_t hi, unsigned char *buf)
{
	struct mm_page_region *r = (struct mm_page_region *)(void *)buf;
	const size_t nreg = MM_VEC / sizeof(*r);
	size_t n0 = mm.d2.n;
	uint64_t total0 = mm.d2.total;
	uintptr_t at = lo;
	while (at < hi) {
		struct mm_scan_arg a = {
		    .size = sizeof(a),
		    .start = at,
		    .end = hi,
		    .vec = (uintptr_t)r,
		    .vec_len = nreg,
		    /* not present, or on the zero page */
		    .category_inverted = MM_PAGE_IS_PRESENT,
		    .category_anyof_mask =
		        MM_PAGE_IS_PRESENT | MM_PAGE_IS_PFNZERO,
		    .return_mask = MM_PAGE_IS_PRESENT | MM_PAGE_IS_PFNZERO,
		};
		long n = syscall(SYS_ioctl, pm, MM_PAGEMAP_SCAN, &a);
		if (n < 0) {
			/* ENOTTY: before 6.7. Any other refusal (a sandbox)
			 * would repeat: mincore alone from now on. */
			if (errno != EINTR)
				mm.no_scan = true;
			mm.d2.n = n0; /* as before this range */
			mm.d2.total = total0;
			return false;
		}
		for (long i = 0; i < n; i++) {
			uintptr_t p = r[i].start < at ? at : r[i].start;
			uintptr_t q = r[i].end > hi ? hi : r[i].end;
			if (p < q)
				d2_append(p, q);
		}
		if (a.walk_end <= at)
			break;
		at = a.walk_end;
	}
	return true;
}

static void reconcile_range(uintptr_t lo, uintptr_t hi, unsigned char *vec)
{
	while (lo < hi) {
		size_t n = (hi - lo) / mm.page;
		if (n > MM_VEC)
			n = MM_VEC;
		uintptr_t end = lo + n * mm.page;
		if (sys_mincore(lo, end - lo, vec) != 0) {
			struct mtc_range piece[16];
			uintptr_t at = lo;
			size_t k;
			do {
				k = mtc_maptable_pieces(&mm.d, at, end, piece,
				                        16);
				for (size_t i = 0; i < k; i++)
					d2_append(piece[i].lo, piece[i].hi);
				if (k)
					at = piece[k - 1].hi;
			} while (k == 16);
		} else {
			size_t p = 0;
			while (p < n) {
				p = skip_resident(vec, p, n);
				size_t q = skip_absent(vec, p, n);
				if (q > p)
					d2_append(lo + p * mm.page,
					          lo + q * mm.page);
				p = q;
			}
		}
		lo = end;
	}
}

static void reconcile_locked(void)
{
	_Alignas(8) unsigned char vec[MM_VEC];
	uint64_t t0 = now_ns();
	young_age(t0);
	mm.d2.n = 0;
	mm.d2.total = 0;
	/* Opened for this reconcile only: a descriptor kept open would be
	 * one the program did not open (its first open() would not get the
	 * number it expects). */
	int pm = -1;
	if (!mm.no_scan)
		pm = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/pagemap",
		                  O_RDONLY | O_CLOEXEC);
	if (pm < 0)
		mm.no_scan = true;
	for (size_t i = 0; i < mm.t.n; i++)
		if (mm.no_scan ||
		    !scan_range(pm, mm.t.v[i].lo, mm.t.v[i].hi, vec))
			reconcile_range(mm.t.v[i].lo, mm.t.v[i].hi, vec);
	if (pm >= 0)
		syscall(SYS_close, pm);
	for (int g = 0; g < 2; g++)
		for (size_t i = 0; i < mm.y[g].n && mm.d2.n; i++)
			mtc_maptable_remove(&mm.d2, mm.y[g].v[i].lo,
			                    mm.y[g].v[i].hi, NULL, 0, NULL);
	struct mtc_maptable old = mm.d;
	mm.d = mm.d2;
	mm.d2 = old;
	uint64_t t1 = now_ns();
	mm.rec_at = t1;
	mm.rec_cost = t1 - t0;
}

/* On the mapping calls' path: at most every MM_REC_EVERY_NS, and never
 * more often than MM_REC_SHARE times its own last cost (so it takes at
 * most 1% of the time even of a program that does nothing but map). */
#define MM_REC_EVERY_NS (100u * 1000000u)
#define MM_REC_SHARE    100u
static void maybe_reconcile(void)
{
	if (mm.t.n == 0)
		return;
	uint64_t now = now_ns();
	uint64_t wait = mm.rec_cost * MM_REC_SHARE;
	if (wait < MM_REC_EVERY_NS)
		wait = MM_REC_EVERY_NS;
	if (now - mm.rec_at >= wait)
		reconcile_locked();
}

/* Publish a changed figure while still holding the lock (so stores are in
 * the order of the changes), then let go; an unattached process tries to
 * attach now, outside the lock, so a program that only maps is seen. */
static void leave(uint64_t before)
{
	maybe_reconcile();
	uint64_t now = figure();
	if (now != before)
		mtc_mapped_store(now);
	pthread_mutex_unlock(&mm.lock);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	mm_busy = 0;
	if (now != before)
		mtc_mapped_changed();
}

/*
 * Bring the figure to what the kernel says is resident of the counted
 * ranges, for a caller outside the program's mapping calls: from any
 * thread, never allocating through malloc, never attaching. `now`
 * (memtally_flush(): the program asks for its figure now) waits for the
 * table's lock (held across one system call) and whatever the last
 * reconcile cost; otherwise (the periodic refresh) a held lock skips the
 * round, and it runs at most once per MM_REC_SHARE times its own last
 * cost: at most 1% of a CPU however often it is asked. Cost: measured in
 * docs/ARCHITECTURE.md.
 */
static void reconcile_outside(bool now)
{
	if (!__atomic_load_n(&mm.ready, __ATOMIC_ACQUIRE) || mm_busy ||
	    mm_in_fork || __atomic_load_n(&mm.t.n, __ATOMIC_RELAXED) == 0 ||
	    !mm_fork_seen())
		return;
	mm_busy = 1; /* as in enter(): busy before the lock */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	int locked = now ? pthread_mutex_lock(&mm.lock)
	                 : pthread_mutex_trylock(&mm.lock);
	if (locked == 0) {
		if (now || now_ns() - mm.rec_at >= mm.rec_cost * MM_REC_SHARE) {
			uint64_t before = figure();
			reconcile_locked();
			if (figure() != before)
				mtc_mapped_store(figure());
		}
		pthread_mutex_unlock(&mm.lock);
	}
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	mm_busy = 0;
}

void mtc_maps_reconcile(void)
{
	reconcile_outside(false);
}

void mtc_maps_reconcile_now(void)
{
	reconcile_outside(true);
}

void mtc_mapped_resync(void)
{
	if (!__atomic_load_n(&mm.ready, __ATOMIC_ACQUIRE) || mm_in_fork ||
	    !mm_fork_seen())
		return;
	if (mm_busy) { /* a signal handler of a thread inside the table */
		mtc_mapped_store(figure());
		return;
	}
	mm_busy = 1; /* as in enter(): busy before the lock */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	pthread_mutex_lock(&mm.lock);
	mtc_mapped_store(figure());
	pthread_mutex_unlock(&mm.lock);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	mm_busy = 0;
}

/* ---- the interposed calls ---------------------------------------------- */

static void *do_mmap(void *addr, size_t len, int prot, int flags, int fd,
                     off_t off, const void *ret)
{
	int counted = counted_kind(prot, flags);
	int reserved = reserved_kind(prot, flags);
	int fixed = flags & MAP_FIXED; /* replaces what was there */
	if (!(counted || reserved || fixed) || !enter(ret))
		return sys_mmap(addr, len, prot, flags, fd, off);
	/* errno as the call leaves it: the table's own failures (no
	 * memory to grow it) are not the program's. */
	int e = errno;
	uint64_t before = figure();
	void *p = sys_mmap(addr, len, prot, flags, fd, off);
	if (p == MAP_FAILED)
		e = errno;
	if (p != MAP_FAILED) {
		uintptr_t lo = (uintptr_t)p, hi = page_up(lo + len);
		if (fixed) {
			mtc_maptable_remove(&mm.t, lo, hi, NULL, 0, NULL);
			mtc_maptable_remove(&mm.d, lo, hi, NULL, 0, NULL);
		}
		/* A commit over a reservation (HotSpot, Go): a runtime
		 * commits ahead of use, so its fresh pages (none resident
		 * yet) count as they are touched, from the next reconcile.
		 * Any other new mapping counts in full for a while. */
		int commit = counted && fixed &&
		             mtc_maptable_counted(&mm.r, lo, hi) != 0;
		/* Whatever the kernel handed out is no older reservation,
		 * and is copied into a fork's child. */
		mtc_maptable_remove(&mm.r, lo, hi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.f, lo, hi, NULL, 0, NULL);
		if (counted) {
			mtc_maptable_add(&mm.t, lo, hi);
			if (commit) {
				young_remove(lo, hi);
				if (mtc_maptable_counted(&mm.t, lo, hi) ==
				    hi - lo)
					mtc_maptable_add(&mm.d, lo, hi);
			} else {
				young_add(lo, hi);
			}
		} else {
			young_remove(lo, hi);
			if (reserved)
				mtc_maptable_add(&mm.r, lo, hi);
		}
	}
	leave(before);
	errno = e;
	return p;
}

MM_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd,
                     off_t off)
{
	return do_mmap(addr, len, prot, flags, fd, off,
	               __builtin_return_address(0));
}

MM_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd,
                       off_t off)
{
	return do_mmap(addr, len, prot, flags, fd, off,
	               __builtin_return_address(0));
}

MM_EXPORT int munmap(void *addr, size_t len)
{
	uintptr_t lo = (uintptr_t)addr;
	/* Nothing counted, or arguments the kernel refuses before it unmaps
	 * anything: straight through. */
	if ((__atomic_load_n(&mm.t.n, __ATOMIC_RELAXED) == 0 &&
	     __atomic_load_n(&mm.r.n, __ATOMIC_RELAXED) == 0) ||
	    !len || (lo & (mm.page - 1)) || !enter(__builtin_return_address(0)))
		return sys_munmap(addr, len);
	int e = errno;
	uint64_t before = figure();
	struct mtc_range back[16], rback[16];
	size_t nback = 0, nrback = 0;
	uintptr_t hi = page_up(lo + len);
	mtc_maptable_remove(&mm.t, lo, hi, back, 16, &nback);
	mtc_maptable_remove(&mm.r, lo, hi, rback, 16, &nrback);
	int r = sys_munmap(addr, len);
	if (r != 0) { /* nothing was unmapped: count it again */
		e = errno;
		for (size_t i = 0; i < nback; i++)
			mtc_maptable_add(&mm.t, back[i].lo, back[i].hi);
		for (size_t i = 0; i < nrback; i++)
			mtc_maptable_add(&mm.r, rback[i].lo, rback[i].hi);
	}
	/* Pages not counted (not resident) leave with their range; on a
	 * failure they are counted again until the next reconcile. */
	mtc_maptable_remove(&mm.d, lo, hi, NULL, 0, NULL);
	if (r == 0) { /* keeps `y` to what is mapped: pymalloc maps and
		       * unmaps thousands of arenas a second */
		young_remove(lo, hi);
		mtc_maptable_remove(&mm.f, lo, hi, NULL, 0, NULL);
	}
	leave(before);
	errno = e;
	return r;
}

/* The pieces of one table inside a range that mremap moves. Beyond
 * MM_MOVE_PIECES pieces the rest is not carried (it is uncounted). */
#define MM_MOVE_PIECES 64
struct move {
	struct mtc_range v[MM_MOVE_PIECES];
	size_t n;
};

static void move_take(const struct mtc_maptable *t, uintptr_t lo, uintptr_t hi,
                      struct move *m)
{
	m->n = mtc_maptable_pieces(t, lo, hi, m->v, MM_MOVE_PIECES);
}

/* Put the pieces taken from [lo, hi) at [nlo, nhi): shifted, clipped to
 * the new length, and, when `extend`, a grown mapping's new pages in the
 * state of the last old page (the kernel extends the last mapping; but
 * its new pages are counted, not "known not resident"). */
static void move_put(struct mtc_maptable *t, const struct move *m, uintptr_t lo,
                     uintptr_t hi, uintptr_t nlo, uintptr_t nhi, int extend)
{
	for (size_t i = 0; i < m->n; i++) {
		uintptr_t a = m->v[i].lo - lo + nlo;
		uintptr_t b = m->v[i].hi - lo + nlo;
		if (a >= nhi)
			break;
		mtc_maptable_add(t, a, b < nhi ? b : nhi);
	}
	uintptr_t old_end = nlo + (hi - lo);
	if (extend && nhi > old_end && m->n && m->v[m->n - 1].hi == hi)
		mtc_maptable_add(t, old_end, nhi);
}

MM_EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags,
                       ...)
{
	void *new_addr = NULL;
	if (flags & (MREMAP_FIXED | MREMAP_DONTUNMAP)) {
		va_list ap;
		va_start(ap, flags);
		new_addr = va_arg(ap, void *);
		va_end(ap);
	}
	uintptr_t lo = (uintptr_t)old;
	if ((__atomic_load_n(&mm.t.n, __ATOMIC_RELAXED) == 0 &&
	     __atomic_load_n(&mm.r.n, __ATOMIC_RELAXED) == 0) ||
	    !old_len || (lo & (mm.page - 1)) ||
	    !enter(__builtin_return_address(0)))
		return sys_mremap(old, old_len, new_len, flags, new_addr);
	int e = errno;
	uint64_t before = figure();
	uintptr_t hi = page_up(lo + old_len);
	/* What moves keeps its state page by page: the counted pieces and the
	 * reservation's pieces of [lo, hi) (a committed reservation is both;
	 * the kernel moves several mappings at once since Linux 6.17). */
	struct move mt = {0}, mr = {0}, md = {0}, mf = {0};
	move_take(&mm.t, lo, hi, &mt);
	move_take(&mm.r, lo, hi, &mr);
	move_take(&mm.d, lo, hi, &md);
	move_take(&mm.f, lo, hi, &mf); /* the advice moves with the mapping */
	int keep_old = flags & MREMAP_DONTUNMAP;
	if (!keep_old) {
		mtc_maptable_remove(&mm.t, lo, hi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.r, lo, hi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.d, lo, hi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.f, lo, hi, NULL, 0, NULL);
		young_remove(lo, hi);
	}
	void *p = sys_mremap(old, old_len, new_len, flags, new_addr);
	if (p == MAP_FAILED) {
		e = errno;
		if (!keep_old) { /* nothing moved: put them back */
			move_put(&mm.t, &mt, lo, hi, lo, hi, 1);
			move_put(&mm.r, &mr, lo, hi, lo, hi, 1);
			move_put(&mm.d, &md, lo, hi, lo, hi, 0);
			move_put(&mm.f, &mf, lo, hi, lo, hi, 1);
		}
	} else {
		uintptr_t nlo = (uintptr_t)p, nhi = page_up(nlo + new_len);
		/* MREMAP_FIXED replaced whatever was at the target. */
		mtc_maptable_remove(&mm.t, nlo, nhi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.r, nlo, nhi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.d, nlo, nhi, NULL, 0, NULL);
		mtc_maptable_remove(&mm.f, nlo, nhi, NULL, 0, NULL);
		move_put(&mm.t, &mt, lo, hi, nlo, nhi, 1);
		move_put(&mm.r, &mr, lo, hi, nlo, nhi, 1);
		move_put(&mm.d, &md, lo, hi, nlo, nhi, 0);
		move_put(&mm.f, &mf, lo, hi, nlo, nhi, 1);
		if (nhi > nlo + (hi - lo)) /* grown: new pages, counted */
			young_add(nlo + (hi - lo), nhi);
		/* The moved pieces of `d` stay inside those of `t`, unless
		 * more pieces than MM_MOVE_PIECES were left behind. */
		struct move chk;
		move_take(&mm.d, nlo, nhi, &chk);
		for (size_t i = 0; i < chk.n; i++)
			if (mtc_maptable_counted(&mm.t, chk.v[i].lo,
			                         chk.v[i].hi) !=
			    chk.v[i].hi - chk.v[i].lo)
				mtc_maptable_remove(&mm.d, chk.v[i].lo,
				                    chk.v[i].hi, NULL, 0, NULL);
	}
	leave(before);
	errno = e;
	return p;
}

/* Count the parts of [lo, hi) that are reservations (made writable), or
 * uncount them (made inaccessible: decommitted). */
static void reservation_protect(uintptr_t lo, uintptr_t hi, int writable)
{
	struct mtc_range piece[16];
	size_t n;
	do {
		n = mtc_maptable_pieces(&mm.r, lo, hi, piece, 16);
		for (size_t i = 0; i < n; i++) {
			if (writable) {
				mtc_maptable_add(&mm.t, piece[i].lo,
				                 piece[i].hi);
				young_add(piece[i].lo, piece[i].hi);
			} else {
				mtc_maptable_remove(&mm.t, piece[i].lo,
				                    piece[i].hi, NULL, 0, NULL);
				young_remove(piece[i].lo, piece[i].hi);
			}
			/* Committed again or decommitted: either way no page
			 * of it is "known not resident" any more (a commit
			 * counts at once, as a new mapping does). */
			mtc_maptable_remove(&mm.d, piece[i].lo, piece[i].hi,
			                    NULL, 0, NULL);
		}
		if (n)
			lo = piece[n - 1].hi;
	} while (n == 16);
}

/*
 * Write access given counts a reservation's pages; all access taken away
 * (PROT_NONE: how V8 and .NET decommit) uncounts them. Read-only or
 * read-execute leaves them as they are: a JIT flipping its pages between
 * read-write and read-execute (W^X) still holds them, and so does a
 * runtime's read-only space. A call that fails is taken as having changed
 * nothing (Linux may have changed a prefix before an ENOMEM; the next
 * mprotect or munmap of those pages corrects the figure).
 */
static int kernel_mprotect(void *addr, size_t len, int prot, int use_pkey,
                           int pkey)
{
	return use_pkey ? sys_pkey_mprotect(addr, len, prot, pkey)
	                : sys_mprotect(addr, len, prot);
}

static int do_mprotect(void *addr, size_t len, int prot, int use_pkey, int pkey,
                       const void *ret)
{
	uintptr_t lo = (uintptr_t)addr;
	int counts = (prot & PROT_WRITE) || prot == PROT_NONE;
	/* No reservation made, or no change that counts: straight through. */
	if (__atomic_load_n(&mm.r.n, __ATOMIC_RELAXED) == 0 || !counts ||
	    !len || (lo & (mm.page - 1)) || !enter(ret))
		return kernel_mprotect(addr, len, prot, use_pkey, pkey);
	uint64_t before = figure();
	int r = kernel_mprotect(addr, len, prot, use_pkey, pkey);
	int e = errno;
	if (r == 0)
		reservation_protect(lo, page_up(lo + len),
		                    (prot & PROT_WRITE) != 0);
	leave(before);
	errno = e;
	return r;
}

MM_EXPORT int mprotect(void *addr, size_t len, int prot)
{
	return do_mprotect(addr, len, prot, 0, 0, __builtin_return_address(0));
}

/* The same with a memory protection key (V8 may use them for its code). */
MM_EXPORT int pkey_mprotect(void *addr, size_t len, int prot, int pkey)
{
	return do_mprotect(addr, len, prot, 1, pkey,
	                   __builtin_return_address(0));
}

/*
 * Pages given back with madvise leave the figure at once: MADV_DONTNEED
 * and MADV_REMOVE free them, MADV_PAGEOUT pushes them out, MADV_FREE lets
 * the kernel take them whenever it needs memory (until then they are
 * still resident, in RssAnon as LazyFree; a later reconcile, which cannot
 * tell them from pages written again, counts what the kernel still keeps
 * of them). Only the counted part of the range changes; advice of any
 * other kind, a failed call, memory not counted (the allocators' own,
 * a file) and calls from jemalloc's code go straight through.
 * posix_madvise needs nothing: glibc's POSIX_MADV_DONTNEED does nothing
 * (POSIX allows no data loss), and its other advice frees no page.
 */
static int gives_back(int advice)
{
	switch (advice) {
	case MADV_DONTNEED:
	case MADV_FREE:
	case MADV_REMOVE:
#ifdef MADV_PAGEOUT
	case MADV_PAGEOUT:
#endif
		return 1;
	default:
		return 0;
	}
}

/* Mark the counted pieces of [lo, hi) as not resident. */
static void mark_absent(uintptr_t lo, uintptr_t hi)
{
	struct mtc_range piece[16];
	size_t n;
	do {
		n = mtc_maptable_pieces(&mm.t, lo, hi, piece, 16);
		for (size_t i = 0; i < n; i++) {
			mtc_maptable_add(&mm.d, piece[i].lo, piece[i].hi);
			young_remove(piece[i].lo, piece[i].hi);
		}
		if (n)
			lo = piece[n - 1].hi;
	} while (n == 16);
}

/* MADV_DONTFORK and MADV_DOFORK: which ranges a fork's child lacks. */
static int dontfork_advice(uintptr_t lo, size_t len, int advice,
                           const void *ret)
{
	if ((__atomic_load_n(&mm.t.n, __ATOMIC_RELAXED) == 0 &&
	     __atomic_load_n(&mm.r.n, __ATOMIC_RELAXED) == 0) ||
	    !len || (lo & (mm.page - 1)) || !enter(ret))
		return sys_madvise((void *)lo, len, advice);
	uint64_t before = figure();
	int r = sys_madvise((void *)lo, len, advice);
	int e = errno;
	if (r == 0 && advice == MADV_DONTFORK)
		mtc_maptable_add(&mm.f, lo, page_up(lo + len));
	else if (r == 0)
		mtc_maptable_remove(&mm.f, lo, page_up(lo + len), NULL, 0,
		                    NULL);
	leave(before);
	errno = e;
	return r;
}

MM_EXPORT int madvise(void *addr, size_t len, int advice)
{
	uintptr_t lo = (uintptr_t)addr;
	if (advice == MADV_DONTFORK || advice == MADV_DOFORK)
		return dontfork_advice(lo, len, advice,
		                       __builtin_return_address(0));
	if (!gives_back(advice) ||
	    __atomic_load_n(&mm.t.n, __ATOMIC_RELAXED) == 0 || !len ||
	    (lo & (mm.page - 1)) || !enter(__builtin_return_address(0)))
		return sys_madvise(addr, len, advice);
	uint64_t before = figure();
	int r = sys_madvise(addr, len, advice);
	int e = errno;
	if (r == 0) {
		mark_absent(lo, page_up(lo + len));
		/* Not reconciled on this path right after: that would count
		 * lazily freed pages again at once. */
		if (advice == MADV_FREE)
			mm.rec_at = now_ns();
	}
	leave(before);
	errno = e;
	return r;
}
