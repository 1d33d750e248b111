/*
 * fuzz_procfs.c - libFuzzer target: the /proc text parsers of procfs.c and
 * vouch.c, where a worker chooses part of what memtallyd reads: its comm
 * (prctl PR_SET_NAME, any bytes but NUL, at most 15 of them; 64 for some
 * kernel threads) sits raw in /proc/PID/stat and escaped in the Name:
 * line of /proc/PID/status, and its Groups: line can be hundreds of KiB.
 *
 * The input: byte 0 picks a buffer size for mts_read_short_lines (1..4096)
 * and the comm length (bits 0-5, at most 63); the rest is the text.
 *   1. The text as a stat file: mts_parse_stat_starttime and
 *      mts_parse_stat_comm return 0 or -EINVAL only; a comm fits its
 *      buffer.
 *   2. A real-shaped stat line "PID (COMM) S 1 ... STARTTIME ..." whose
 *      comm is the text's first bytes (no NUL, as the kernel's): the start
 *      time parsed is exactly the one written, the comm exactly the comm.
 *   3. The text through a pipe into mts_read_short_lines (the real fd
 *      path): the result is NUL-terminated, shorter than the buffer, each
 *      line at most MTS_PROC_LINE_MAX bytes, and every line of it a whole
 *      line of the input, in order. Then mts_parse_status_mem,
 *      mts_parse_smaps_rollup, mts_parse_uid_fields and mts_parse_statm_rss
 *      on it: 0 or -EINVAL, no crash.
 *   4. A real-shaped status file with the comm in Name: (escaped as the
 *      kernel does) and the text as a Groups: line before the memory
 *      lines, read through a pipe with a 4 KiB buffer as rss.c does:
 *      VmRSS, RssAnon, RssShmem, VmSwap and the uids come out exactly.
 */
#include "mts_procfs.h"
#include "mts_vouch.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* `len` bytes through a pipe into mts_read_short_lines (inputs are at
 * most -max_len, well under a pipe's 64 KiB). */
static ssize_t via_pipe(const char *text, size_t len, char *buf, size_t cap)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		abort();
	fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
	size_t off = 0;
	while (off < len) {
		ssize_t w = write(p[1], text + off, len - off);
		if (w <= 0)
			abort();
		off += (size_t)w;
	}
	close(p[1]);
	ssize_t n = mts_read_short_lines(p[0], buf, cap);
	close(p[0]);
	return n;
}

static void check_short_lines(const char *in, size_t inlen, const char *out,
                              ssize_t n, size_t cap)
{
	if (n < 0 || (size_t)n >= cap || out[n] != '\0')
		abort();
	/* Every output line is a whole input line, in order. */
	size_t ip = 0;
	for (size_t op = 0; op < (size_t)n;) {
		const char *nl = memchr(out + op, '\n', (size_t)n - op);
		size_t ol = nl ? (size_t)(nl - (out + op)) : (size_t)n - op;
		if (ol > MTS_PROC_LINE_MAX)
			abort();
		bool found = false;
		while (ip <= inlen && !found) {
			const char *inl = memchr(in + ip, '\n', inlen - ip);
			size_t il =
			    inl ? (size_t)(inl - (in + ip)) : inlen - ip;
			if (il == ol && memcmp(in + ip, out + op, ol) == 0 &&
			    (nl ? inl != NULL : true))
				found = true;
			ip += il + 1;
		}
		if (!found)
			abort();
		op += ol + 1;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	unsigned sel = data[0];
	const char *text = (const char *)data + 1;
	size_t len = size - 1;
	char *s = malloc(len + 1);
	if (!s)
		abort();
	memcpy(s, text, len);
	s[len] = '\0';

	/* 1. Raw stat text. */
	uint64_t st = 0;
	int r = mts_parse_stat_starttime(s, &st);
	if (r != 0 && r != -EINVAL)
		abort();
	char comm[64];
	size_t ccap = 1 + (sel & 63);
	r = mts_parse_stat_comm(s, comm, ccap);
	if ((r != 0 && r != -EINVAL) || strlen(comm) >= ccap)
		abort();

	/* 2. A real-shaped stat line with the text's first bytes as comm. */
	char want[65];
	size_t wl = 0;
	for (size_t i = 0; i < len && wl < (sel & 63); i++)
		if (text[i] != '\0')
			want[wl++] = text[i];
	want[wl] = '\0';
	uint64_t start = 0x0123456789ull ^ (uint64_t)sel << 20;
	char stat[1024];
	snprintf(stat, sizeof(stat),
	         "4242 (%s) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 "
	         "1 0 %" PRIu64 " 12345678 300 18446744073709551615 1 1 0 0 0 "
	         "0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
	         want, start);
	uint64_t got = 0;
	if (mts_parse_stat_starttime(stat, &got) != 0 || got != start)
		abort();
	char back[65];
	if (mts_parse_stat_comm(stat, back, sizeof(back)) != 0 ||
	    strcmp(back, want) != 0)
		abort();

	/* 3. The text as a status file through the fd reader. */
	size_t cap = 1 + ((sel * 16u) % 4096u);
	char *buf = malloc(cap);
	if (!buf)
		abort();
	ssize_t n = via_pipe(text, len, buf, cap);
	check_short_lines(text, len, buf, n, cap);
	struct mts_kernel_mem km;
	r = mts_parse_status_mem(buf, &km);
	if (r != 0 && r != -EINVAL)
		abort();
	r = mts_parse_smaps_rollup(buf, &km);
	if (r != 0 && r != -EINVAL)
		abort();
	uint32_t uids[4];
	r = mts_parse_uid_fields(buf, uids, 4);
	if (r != 0 && r != -EINVAL)
		abort();
	uint64_t rss = 0, anon = 0;
	r = mts_parse_statm_rss(s, 4096, &rss, &anon);
	if (r != 0 && r != -EINVAL)
		abort();
	free(buf);

	/* 4. A real-shaped status: escaped comm in Name:, the text (newlines
	 * made spaces) as a Groups: line, then the figures. */
	char name[4 * 64 + 1];
	size_t nl = 0;
	for (size_t i = 0; i < wl; i++) {
		unsigned char c = (unsigned char)want[i];
		static const char esc[] = "\f\n\r\t\v\\\a\033\"";
		static const char rep[] = "fnrtv\\ae\"";
		const char *e = strchr(esc, c);
		if (c && e) {
			name[nl++] = '\\';
			name[nl++] = rep[e - esc];
		} else {
			name[nl++] = (char)c;
		}
	}
	name[nl] = '\0';
	size_t slen = len + 2048;
	char *status = malloc(slen);
	if (!status)
		abort();
	int h = snprintf(status, slen,
	                 "Name:\t%s\nUmask:\t0022\nState:\tS (sleeping)\n"
	                 "Tgid:\t4242\nPid:\t4242\nPPid:\t1\n"
	                 "Uid:\t1000\t1001\t1002\t1003\n"
	                 "Gid:\t1000\t1000\t1000\t1000\nGroups:\t",
	                 name);
	for (size_t i = 0; i < len; i++)
		status[h++] =
		    text[i] == '\n' || text[i] == '\0' ? ' ' : text[i];
	h += snprintf(status + h, slen - (size_t)h,
	              "\nVmPeak:\t  999 kB\nVmRSS:\t   %u kB\n"
	              "RssAnon:\t   %u kB\nRssFile:\t  77 kB\n"
	              "RssShmem:\t   %u kB\nVmSwap:\t   %u kB\nThreads:\t1\n",
	              sel, sel + 1, sel + 2, sel + 3);
	char sbuf[4096];
	n = via_pipe(status, (size_t)h, sbuf, sizeof(sbuf));
	check_short_lines(status, (size_t)h, sbuf, n, sizeof(sbuf));
	memset(&km, 0, sizeof(km));
	if (mts_parse_status_mem(sbuf, &km) != 0 ||
	    km.rss != (uint64_t)sel << 10 ||
	    km.anon != (uint64_t)(sel + 1) << 10 ||
	    km.shmem != (uint64_t)(sel + 2) << 10 ||
	    km.held != (uint64_t)(3 * sel + 6) << 10 || !km.has_uids ||
	    km.uids[0] != 1000 || km.uids[1] != 1001 || km.uids[2] != 1002)
		abort();
	free(status);
	free(s);
	return 0;
}
