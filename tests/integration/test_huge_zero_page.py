"""Pages only read, in transparent huge pages: a worker maps 128 MiB with
MADV_HUGEPAGE and reads a byte of every page, which maps the kernel's huge
zero page (no RssAnon); memtally counts nothing of it once the mapping is
no longer young, and counts what the worker then writes (as
test_madvise's test_read_only_pages_not_held does in small pages).

Skipped (77), with the reason, where the kernel makes this moot: no
pagemap scan (before 6.7); transparent huge pages off; no huge zero page
(transparent_hugepage/use_zero_page 0: a read allocates 2 MiB, which is
held, and counting it is right); or a pagemap scan that reports the huge
zero page as memory.
"""
from harness import run
from test_madvise import read_only_pages


def test_read_only_huge_pages_not_held():
    read_only_pages(huge=True)


if __name__ == "__main__":
    run([test_read_only_huge_pages_not_held])
