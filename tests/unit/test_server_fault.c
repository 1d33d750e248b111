/*
 * test_server_fault.c - a page of a slot table that faults when memtallyd
 * touches it (server/fault.c): real SIGBUSes on a mapping whose object was
 * cut short, and a real registry whose worker's slot page memtallyd can no
 * longer read.
 */
#include "test_server_fixture.h"

#include <sys/mman.h>

#include "mts_fault.h"
#include "mts_metrics.h"
#include "mts_registry.h"
#include "mts_rss.h"
#include "mts_vouch.h"

static size_t page(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

/* A shared mapping of `pages` pages of a memfd of ours, each page's first
 * word its index + 0x11; *fd the memfd. */
static volatile uint64_t *object(unsigned pages, int *fd)
{
	*fd = memfd_create("fault-test", MFD_CLOEXEC);
	cr_assert_geq(*fd, 0);
	cr_assert_eq(ftruncate(*fd, (off_t)(pages * page())), 0);
	char *m = mmap(NULL, pages * page(), PROT_READ | PROT_WRITE, MAP_SHARED,
	               *fd, 0);
	cr_assert_neq(m, MAP_FAILED);
	for (unsigned i = 0; i < pages; i++)
		*(uint64_t *)(m + i * page()) = 0x11 + i;
	return (volatile uint64_t *)m;
}

static volatile uint64_t *at(volatile uint64_t *m, unsigned pg)
{
	return (volatile uint64_t *)((volatile char *)m + pg * page());
}

struct parts {
	uintptr_t base;
	size_t bytes;
	unsigned n;
	uintptr_t first;
};

static void count_part(void *arg, void *addr, size_t bytes)
{
	struct parts *p = arg;
	if (!p->n++)
		p->first = (uintptr_t)addr - p->base;
	p->bytes += bytes;
}

static struct parts scan(volatile uint64_t *m, unsigned pages)
{
	struct parts p = {.base = (uintptr_t)m};
	cr_assert_eq(mts_fault_scan((void *)m, pages * page(), count_part, &p),
	             0);
	return p;
}

Test(fault, a_sigbus_in_a_watched_mapping_reads_a_spare_and_goes_on)
{
	cr_assert_eq(mts_fault_init(8), 0);
	int fd;
	volatile uint64_t *m = object(4, &fd);
	cr_assert_eq(mts_fault_watch((void *)m, 4 * page()), 0);
	/* Pages 1..3 are past the object's end now: touching one is a
	 * SIGBUS, as a hole is under strict overcommit. */
	cr_assert_eq(ftruncate(fd, (off_t)page()), 0);
	uint64_t c0 = mts_fault_count();
	cr_assert_eq(*at(m, 1), 0, "a spare reads zeros");
	cr_assert_eq(mts_fault_count(), c0 + 1);
	*at(m, 1) = 0x77; /* a write lands on the spare: no fault */
	cr_assert_eq(*at(m, 1), 0x77);
	cr_assert_eq(mts_fault_count(), c0 + 1);
	cr_assert_eq(*at(m, 0), 0x11, "the page before is untouched");
	struct parts p = scan(m, 4);
	cr_assert_eq(p.bytes, page(), "lost: %zu bytes", p.bytes);
	cr_assert_eq(p.first, page());
	*at(m, 2) = 5; /* a write faults too */
	cr_assert_eq(*at(m, 2), 5);
	cr_assert_eq(mts_fault_count(), c0 + 2);
	cr_assert_eq(scan(m, 4).bytes, 2 * page());

	/* The object whole again: page 1 mapped back shows the object's
	 * contents, and its spare is free and zeroed for the next. */
	cr_assert_eq(ftruncate(fd, (off_t)(4 * page())), 0);
	uint64_t v = 0x55;
	cr_assert_eq(pwrite(fd, &v, sizeof(v), (off_t)page()), sizeof(v));
	cr_assert_eq(mts_fault_restore((void *)at(m, 1), fd, page()), 0);
	cr_assert_eq(*at(m, 1), 0x55, "not the object's page again");
	p = scan(m, 4);
	cr_assert_eq(p.bytes, page());
	cr_assert_eq(p.first, 2 * page());
	cr_assert_eq(ftruncate(fd, (off_t)page()), 0);
	cr_assert_eq(*at(m, 3), 0, "a reused spare kept another page's data");
	cr_assert_eq(mts_fault_count(), c0 + 3);
	mts_fault_unwatch((void *)m);
	munmap((void *)m, 4 * page());
	close(fd);
}

Test(fault, more_faulting_pages_than_spares_share_the_last)
{
	cr_assert_eq(mts_fault_init(8), 0);
	unsigned n = 3 * MTS_FAULT_SPARES;
	int fd;
	volatile uint64_t *m = object(n, &fd);
	cr_assert_eq(mts_fault_watch((void *)m, n * page()), 0);
	cr_assert_eq(ftruncate(fd, 0), 0);
	uint64_t c0 = mts_fault_count();
	for (unsigned i = 0; i < n; i++)
		cr_assert_eq(*at(m, i), 0);
	for (unsigned i = 0; i < n; i++)
		(void)*at(m, i); /* none faults again */
	cr_assert_eq(mts_fault_count(), c0 + n);
	cr_assert_eq(scan(m, n).bytes, n * page());
	mts_fault_unwatch((void *)m);
	munmap((void *)m, n * page());
	close(fd);
}

/* The wait status of a child of ours (the handler installed) that runs
 * `body` and then exits 0. */
static int child_status(void (*body)(void))
{
	cr_assert_eq(mts_fault_init(8), 0);
	pid_t pid = fx_fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		body();
		_exit(0);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return st;
}

static void read_unwatched(void)
{
	int fd;
	volatile uint64_t *m = object(2, &fd);
	if (ftruncate(fd, 0) < 0)
		_exit(2);
	uint64_t v = *at(m, 1); /* not watched: this must kill us */
	_exit(v == 0 ? 0 : 3);
}

Test(fault, a_sigbus_outside_the_tables_is_not_answered)
{
	int st = child_status(read_unwatched);
	/* The default action (SIGBUS), or a sanitizer's report of it. */
	cr_assert(!(WIFEXITED(st) && WEXITSTATUS(st) == 0),
	          "a SIGBUS in memory that is not a table was answered");
	cr_assert(WIFSIGNALED(st)
	              ? WTERMSIG(st) == SIGBUS
	              : WEXITSTATUS(st) != 2 && WEXITSTATUS(st) != 3,
	          "status %#x", st);
}

Test(fault, two_tables_that_meet_each_find_their_own_page)
{
	cr_assert_eq(mts_fault_init(8), 0);
	/* Two objects mapped end to end, as the kernel often places two
	 * tables: the spares of A's last page and B's first, faulted in
	 * that order, run on in offset and merge into one mapping. */
	int fa, fb;
	volatile uint64_t *a = object(2, &fa);
	volatile uint64_t *b = object(2, &fb);
	char *room = mmap(NULL, 4 * page(), PROT_NONE,
	                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(room, MAP_FAILED);
	munmap((void *)a, 2 * page());
	munmap((void *)b, 2 * page());
	a = mmap(room, 2 * page(), PROT_READ | PROT_WRITE,
	         MAP_SHARED | MAP_FIXED, fa, 0);
	b = mmap(room + 2 * page(), 2 * page(), PROT_READ | PROT_WRITE,
	         MAP_SHARED | MAP_FIXED, fb, 0);
	cr_assert_eq(mts_fault_watch((void *)a, 2 * page()), 0);
	cr_assert_eq(mts_fault_watch((void *)b, 2 * page()), 0);
	cr_assert_eq(ftruncate(fa, (off_t)page()), 0);
	cr_assert_eq(ftruncate(fb, 0), 0);
	cr_assert_eq(*at(a, 1), 0);
	cr_assert_eq(*at(b, 0), 0);
	struct parts pa = scan(a, 2), pb = scan(b, 2);
	cr_assert_eq(pa.bytes, page(), "A found %zu bytes", pa.bytes);
	cr_assert_eq(pa.first, page());
	cr_assert_eq(pb.bytes, page(), "B found %zu bytes", pb.bytes);
	cr_assert_eq(pb.first, 0);
	mts_fault_unwatch((void *)a);
	mts_fault_unwatch((void *)b);
	munmap(room, 4 * page());
	close(fa);
	close(fb);
}

Test(fault, an_unwatched_mappings_spares_are_free_again)
{
	cr_assert_eq(mts_fault_init(8), 0);
	unsigned n = MTS_FAULT_SPARES - 1; /* every spare of its own */
	for (int round = 0; round < 2; round++) {
		int fd;
		volatile uint64_t *m = object(n, &fd);
		cr_assert_eq(mts_fault_watch((void *)m, n * page()), 0);
		cr_assert_eq(ftruncate(fd, 0), 0);
		for (unsigned i = 0; i < n; i++)
			*at(m, i) = 0x100 + i;
		/* Shared spares would show the last page's value. */
		for (unsigned i = 0; i < n; i++)
			cr_assert_eq(*at(m, i), 0x100 + i,
			             "round %d, page %u shares a spare", round,
			             i);
		mts_fault_unwatch((void *)m);
		munmap((void *)m, n * page());
		close(fd);
	}
}

static void bus_by_kill(void)
{
	kill(getpid(), SIGBUS);
}

Test(fault, a_sigbus_sent_by_kill_is_not_swallowed)
{
	int st = child_status(bus_by_kill);
	cr_assert(!(WIFEXITED(st) && WEXITSTATUS(st) == 0),
	          "a SIGBUS from kill() was swallowed");
}

#define ROOT_CLAIM (UINT64_C(1) << 40)

Test(fault, a_worker_whose_slot_page_cannot_be_read_counts_as_the_kernel_holds)
{
	if (geteuid() != 0)
		cr_skip_test("needs root: the worker is a trusted (root) one");
	struct mts_policy pol;
	mts_policy_defaults(&pol);
	pol.fleet_limit = UINT64_C(1) << 50;
	fx_start_policy(&pol); /* the server installs the handler */
	pid_t w = fx_spawn_as_holding(-1, 64 * MIB);
	uint32_t s = fx_register_as(w, 0, "", "");
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)w);
	fx_write(s, (int64_t)ROOT_CLAIM);
	mts_rss_sweep_sync(&srv.reg);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, ROOT_CLAIM, "root counts in full");
	cr_assert(!p->untrusted);

	/* What the handler does when the kernel fails the page. */
	struct mtshm_slot_id *sl = mts_slot(&srv.reg, s);
	cr_assert_eq(mts_fault_replace(sl), 0);
	fx_write(s, (int64_t)ROOT_CLAIM); /* lands on the spare */
	mts_rss_sweep_sync(&srv.reg);
	mts_core_tick(&srv.reg);
	cr_assert(p->slot_lost && p->untrusted, "still taken at its word");
	cr_assert_geq(srv.reg.totals.bytes, 64 * MIB,
	              "what it holds went uncounted");
	/* What the kernel says it holds, not a byte of its claim: root's
	 * table has no allowance. */
	cr_assert_eq(srv.reg.totals.bytes, p->vouch.kernel, "counted %llu",
	             (unsigned long long)srv.reg.totals.bytes);
	cr_assert_eq(srv.reg.totals.bytes, mts_vouch_counted(p));
	/* And /metrics says how many pages were answered so. */
	char *text = fx_metrics_text();
	char want[64];
	snprintf(want, sizeof(want), "\nmemtally_slot_page_faults_total %llu\n",
	         (unsigned long long)mts_fault_count());
	cr_assert(mts_fault_count() >= 1 && strstr(text, want), "no %s",
	          want + 1);
	free(text);

	/* A new image on the page (an exec): its slot is the table's again,
	 * so its client finds the generation memtallyd gave it. */
	struct mtshm_slot_id *real = sl;
	off_t gen_off =
	    (off_t)((char *)&real->generation - (char *)p->table->map.base);
	cr_assert_eq(mts_fault_replace(sl), 0);
	mts_core_tick(&srv.reg);
	cr_assert(p->slot_lost);
	fx_register_image(w, 0, 0x5eed);
	uint64_t gen = 0;
	cr_assert_eq(pread(p->table->map.fd, &gen, sizeof(gen), gen_off),
	             sizeof(gen));
	cr_assert_eq(gen, p->slot_gen, "the exec's generation went to a spare");

	/* Left as it is, a spare is mended within a second or so. */
	cr_assert_eq(mts_fault_replace(sl), 0);
	mts_core_tick(&srv.reg);
	cr_assert(p->slot_lost && p->table->nlost == 1);
	uint64_t end = fx_deadline_ms(5000);
	while (p->table->nlost && fx_ms() < end) {
		usleep(20000);
		mts_core_tick(&srv.reg);
	}
	cr_assert_eq(p->table->nlost, 0, "the page was never mapped back");
	cr_assert(p->slot_lost, "trusted again without registering again");

	/* Its slot handed out again, the page is the table's: a worker's
	 * write through the table's descriptor is what the tick reads. */
	fx_kill(w);
	pid_t w2 = fx_spawn_as_holding(-1, 0);
	uint32_t s2 = fx_register_as(w2, 0, "", "");
	cr_assert_eq(s2, s, "the freed slot was not handed out again");
	struct mts_proc *p2 = mts_find_pid(&srv.reg, (uint32_t)w2);
	cr_assert(!p2->slot_lost && !p2->untrusted);
	sl = mts_slot(&srv.reg, s2);
	mtshm_store_relaxed32(&sl->threads, 1);
	mtshm_store_relaxed32(&sl->lanes_used, 1);
	int64_t v = 3 * MIB;
	off_t off = (off_t)((char *)&mtshm_lane(sl, 0)->bytes -
	                    (char *)p2->table->map.base);
	cr_assert_eq(pwrite(p2->table->map.fd, &v, sizeof(v), off), sizeof(v));
	mts_core_tick(&srv.reg);
	cr_assert_eq(p2->bytes, 3 * MIB, "the slot still reads a spare: %llu",
	             (unsigned long long)p2->bytes);
	fx_stop();
}
