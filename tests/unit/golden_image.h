/*
 * golden_image.h - what the tests of the committed shared-memory images
 * (tests/golden/) share: reading an image whole, and reading its words
 * little-endian at a byte offset, independent of any struct of this build.
 */
#ifndef MEMTALLY_TEST_GOLDEN_IMAGE_H
#define MEMTALLY_TEST_GOLDEN_IMAGE_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>

/* Read `path` into buf: exactly `want` bytes, no more. */
static inline void golden_load(const char *path, unsigned char *buf,
                               size_t want)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot open %s", path);
	size_t n = fread(buf, 1, want, f);
	int extra = fgetc(f);
	fclose(f);
	cr_assert_eq(n, want, "%s: %zu bytes, want %zu", path, n, want);
	cr_assert_eq(extra, EOF, "%s: longer than %zu bytes", path, want);
}

/* The little-endian word of `width` bytes at byte `off` of p. */
static inline uint64_t golden_le(const unsigned char *p, size_t off,
                                 size_t width)
{
	uint64_t v = 0;
	for (size_t i = width; i-- > 0;)
		v = v << 8 | p[off + i];
	return v;
}

#endif
