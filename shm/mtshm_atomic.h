/*
 * mtshm_atomic.h - every access to shared memory goes through these.
 *
 * The mapped structs hold plain fixed-width integers (so their sizes and
 * offsets can be checked at compile time and read by any language); these
 * helpers make each access atomic and name its memory order, as liburing's
 * io_uring_smp_* helpers do. x86-64 and aarch64 both do aligned 4- and
 * 8-byte accesses atomically, and every shared field is naturally aligned.
 */
#ifndef MEMTALLY_SHM_ATOMIC_H
#define MEMTALLY_SHM_ATOMIC_H

#include <stdint.h>

static inline uint64_t mtshm_load_relaxed64(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline uint64_t mtshm_load_acquire64(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline int64_t mtshm_load_relaxeds64(const int64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline int64_t mtshm_load_acquires64(const int64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline uint32_t mtshm_load_relaxed32(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline uint32_t mtshm_load_acquire32(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline void mtshm_store_relaxed64(uint64_t *p, uint64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static inline void mtshm_store_release64(uint64_t *p, uint64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline void mtshm_store_relaxeds64(int64_t *p, int64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static inline void mtshm_store_releases64(int64_t *p, int64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline void mtshm_store_relaxed32(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static inline void mtshm_store_release32(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/* Relaxed add: counters only, nobody orders other data by them. */
static inline void mtshm_add_relaxeds64(int64_t *p, int64_t v)
{
	__atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

/*
 * Add to a counter only the calling thread writes (a lane's `bytes`):
 * not a read-modify-write other writers could race with, since there are
 * none, only a new value that readers see whole. On x86-64 one `add` to
 * memory (its aligned 8-byte store is single-copy atomic, as a relaxed
 * store's is) instead of a load, an add and a store; elsewhere, and under
 * ThreadSanitizer (which does not see inside asm), exactly that.
 */
#if defined(__SANITIZE_THREAD__)
#define MTSHM_OWNED_ASM 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MTSHM_OWNED_ASM 0
#endif
#endif
#if !defined(MTSHM_OWNED_ASM) && defined(__x86_64__)
#define MTSHM_OWNED_ASM 1
#endif
static inline void mtshm_add_owned_s64(int64_t *p, int64_t v)
{
#if defined(MTSHM_OWNED_ASM) && MTSHM_OWNED_ASM
	__asm__("addq %1, %0" : "+m"(*p) : "er"(v));
#else
	__atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v,
	                 __ATOMIC_RELAXED);
#endif
}

static inline uint32_t mtshm_add_relaxed32(uint32_t *p, int32_t v)
{
	return __atomic_fetch_add(p, (uint32_t)v, __ATOMIC_RELAXED);
}

static inline int64_t mtshm_exchange_relaxeds64(int64_t *p, int64_t v)
{
	return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}

/* Claim: acquire on success, so the claimant sees its predecessor's last
 * release-store of the lane. */
static inline int mtshm_cas_acquire32(uint32_t *p, uint32_t expect, uint32_t v)
{
	return __atomic_compare_exchange_n(p, &expect, v, 0, __ATOMIC_ACQUIRE,
					   __ATOMIC_RELAXED);
}

/* Raise *p to at least v. */
static inline void mtshm_max_relaxed32(uint32_t *p, uint32_t v)
{
	uint32_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
	while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, 1,
						       __ATOMIC_RELAXED,
						       __ATOMIC_RELAXED))
		;
}

#endif /* MEMTALLY_SHM_ATOMIC_H */
