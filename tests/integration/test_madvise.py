"""Mapped memory follows what the process still holds of it:

- a C worker maps 300 MiB of private anonymous memory and touches it:
  counted; madvise(MADV_DONTNEED) of all of it: the figure drops to its
  start (at once: the preload follows madvise); touched again: it comes
  back (the next reconcile of the counted ranges against the kernel's
  resident pages; here memtally_flush(), which the worker calls before
  each command); MADV_FREE and MADV_PAGEOUT of half of it: that half
  leaves the figure; each time within 16 MiB of RssAnon's growth.
- a worker that gives back more than it counted (a mapping of 64 MiB of
  which 16 MiB touched; madvise and munmap, twice, over ranges wider than
  it): counted for the 16 MiB it touched, and its
  figure, sampled throughout, never below its start and never above it by
  more than what it holds.
- a worker that only reads 128 MiB it mapped (every page maps the
  kernel's shared zero page: no RssAnon) is counted for nothing of it
  once the mapping is no longer young, and for what it then writes; on a
  kernel without the pagemap scan (before 6.7) that test is skipped:
  there mincore says such pages are resident and they count. It is
  skipped too where reading allocates real pages (no shared zero page:
  a probe here maps 128 MiB, reads it and compares RssAnon): those pages
  are held, and counting them is right. test_huge_zero_page runs it in
  transparent huge pages.
"""
import threading
import time

import ctypes
import fcntl
import mmap
import os

from harness import (MIB, Server, Skip, Worker, check, deadline,
                     read_makes_resident, rss_anon, run, wait_for, worker)

SLACK = 16 * MIB


def say(w, cmd):
    w.send(cmd)
    line = w.readline()
    check(line.startswith("ok"), f"{cmd}: {line!r}")
    return line


def mapped_near(s, w, want, what):
    """Poll until pid's `mapped` is within SLACK of `want` (bytes),
    flushing the worker between polls (memtally_flush() reconciles, as
    the periodic refresh of a quiet process does); returns its ps entry."""
    def near():
        p = s.ps().get(w.pid)
        if p and abs(p["mapped"] - want) <= SLACK:
            return p
        say(w, "flush")
        return None
    return wait_for(what, near, timeout=20)


def mapper(s, group):
    """An `mt_worker map` in `group`, ready and registered: (the worker, its
    first ps entry)."""
    w = Worker(worker("map"), s.env(group=group))
    try:
        check(w.readline().startswith("ready"), "worker not ready")
        say(w, "flush")
        return w, wait_for("registered", lambda: s.ps().get(w.pid))
    except BaseException:
        w.close()
        raise


class _ScanArg(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "size flags start end walk_end vec vec_len max_pages "
        "category_inverted category_mask category_anyof_mask "
        "return_mask").split()]


PAGE_IS_PFNZERO = 1 << 5


def zero_bytes(start, end):
    """Bytes of [start, end) in this process that the pagemap scan (6.7)
    reports as the kernel's zero page, or None without the scan."""
    req = (3 << 30) | (ctypes.sizeof(_ScanArg) << 16) | (ord("f") << 8) | 16
    regions = (ctypes.c_uint64 * 3 * 64)()
    arg = _ScanArg(size=ctypes.sizeof(_ScanArg), start=start, end=end,
                   vec=ctypes.addressof(regions), vec_len=64,
                   category_mask=PAGE_IS_PFNZERO,
                   return_mask=PAGE_IS_PFNZERO)
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        n = fcntl.ioctl(fd, req, arg)
    except OSError:
        return None
    finally:
        os.close(fd)
    return sum(regions[i][1] - regions[i][0] for i in range(n))


def pagemap_scan_works():
    """Does this kernel have PAGEMAP_SCAN (6.7) with the zero-page flag?"""
    buf = ctypes.create_string_buffer(4 * 4096)
    start = (ctypes.addressof(buf) + 4095) & ~4095
    return zero_bytes(start, start + 4096) is not None


def thp_mode():
    """The kernel's transparent huge page mode (always, madvise, never),
    or None where it has none."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None


def huge_zero_scanned():
    """Does the pagemap scan report a read huge page as the zero page?
    (From 6.7 until a 2025 fix it reported the huge zero page as present
    memory.) A 2 MiB-aligned huge page inside a 4 MiB mapping, read once."""
    m = mmap.mmap(-1, 4 * MIB, flags=mmap.MAP_PRIVATE,
                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        first = (addr + 2 * MIB - 1) & ~(2 * MIB - 1)
        _ = m[first - addr]
        got = zero_bytes(first, first + 2 * MIB)
        return got == 2 * MIB
    finally:
        m.close()


def read_only_pages(huge):
    """Skips (with the reason) where the kernel makes the test moot."""
    if not pagemap_scan_works():
        raise Skip("no PAGEMAP_SCAN on this kernel (before 6.7): pages "
                   "only read count, as mincore says they are resident")
    kind = "huge" if huge else "small"
    if huge and thp_mode() in (None, "never"):
        raise Skip(f"transparent huge pages are {thp_mode() or 'absent'} "
                   f"in this kernel: no huge page to read")
    made = read_makes_resident(128, huge)
    if made > SLACK:
        zero = ("huge zero page: transparent_hugepage/use_zero_page is 0"
                if huge else "shared zero page")
        raise Skip(f"reading 128 MiB of untouched anonymous memory in "
                   f"{kind} pages made {made / MIB:.0f} MiB resident in "
                   f"this kernel (no {zero}): read pages are held here, "
                   f"and counting them is right")
    if huge and not huge_zero_scanned():
        raise Skip("this kernel's pagemap scan reports the huge zero page "
                   "as memory (fixed in 2025): a read huge page counts")
    with Server() as s:
        w, base = mapper(s, "zero")
        try:
            rss0 = rss_anon(w.pid)
            say(w, "map_lazy 128")
            say(w, "read 0 128" + (" huge" if huge else ""))
            # Young for 1-2 s (counted in full), then what it holds.
            end = deadline(2.5)
            while time.monotonic() < end:
                say(w, "flush")
                time.sleep(0.1)
            held = rss_anon(w.pid) - rss0
            check(held <= SLACK, f"reading made it resident: +{held}")
            p = mapped_near(s, w, base["mapped"], "read pages not counted")
            read_fig = p["mapped"] - base["mapped"]
            say(w, "touch 0 64")
            held = rss_anon(w.pid) - rss0
            check(held >= 60 * MIB, f"64 MiB written: +{held}")
            p = mapped_near(s, w, base["mapped"] + held, "written counted")
            print(f"  128 MiB read: memtally +{read_fig / MIB:.1f} MiB; "
                  f"64 MiB of it written: +{(p['mapped'] - base['mapped']) / MIB:.1f}"
                  f" MiB (RssAnon +{held / MIB:.1f} MiB)")
        finally:
            w.close()


def test_read_only_pages_not_held():
    read_only_pages(huge=False)


def test_dontneed_then_touched_again():
    with Server() as s:
        w, base = mapper(s, "madv")
        try:
            rss0 = rss_anon(w.pid)

            say(w, "map 300")
            held = rss_anon(w.pid) - rss0
            check(held >= 290 * MIB, f"300 MiB resident: +{held}")
            p = mapped_near(s, w, base["mapped"] + held, "300 MiB counted")
            rows = [("held", p["mapped"] - base["mapped"], held)]

            t0 = time.monotonic()
            say(w, "advise 0 300 dontneed")
            resid = rss_anon(w.pid) - rss0
            check(resid <= SLACK, f"the kernel freed it: +{resid}")
            # No flush here: the drop comes from madvise itself.
            p = wait_for("dropped after MADV_DONTNEED", lambda: (
                lambda p: p if p and p["mapped"] - base["mapped"] <= SLACK
                else None)(s.ps().get(w.pid)), timeout=5)
            rows.append(("after DONTNEED", p["mapped"] - base["mapped"],
                         resid))
            print(f"  dropped {time.monotonic() - t0:.2f} s after madvise",
                  flush=True)

            say(w, "touch 0 300")
            back = rss_anon(w.pid) - rss0
            p = mapped_near(s, w, base["mapped"] + back, "touched again")
            rows.append(("touched again", p["mapped"] - base["mapped"],
                         back))

            say(w, "advise 0 150 free")
            say(w, "advise 150 150 pageout")
            # MADV_FREE'd pages stay resident until the kernel needs them
            # (RssAnon keeps them, as LazyFree): the figure follows the
            # kernel; MADV_PAGEOUT has no swap here to go to and may keep
            # them too. Whatever RssAnon says, the figure says.
            def follows():
                p = s.ps().get(w.pid)
                now = rss_anon(w.pid) - rss0
                if p and abs(p["mapped"] - base["mapped"] - now) <= SLACK:
                    return p, now
                say(w, "flush")
                return None
            p, now = wait_for("follows FREE/PAGEOUT", follows, timeout=20)
            rows.append(("after FREE+PAGEOUT", p["mapped"] - base["mapped"],
                         now))
            for what, mt, ra in rows:
                print(f"  {what:20s} memtally +{mt / MIB:6.1f} MiB  "
                      f"RssAnon +{ra / MIB:6.1f} MiB", flush=True)
            say(w, "unmap")
            p = mapped_near(s, w, base["mapped"], "unmapped")
        finally:
            w.close()


def test_gives_back_more_than_counted():
    with Server() as s:
        w, base = mapper(s, "over")
        try:
            start = base["bytes"]
            low = {"v": start, "p": None}
            stop = threading.Event()

            def sample():  # the figure, as often as the CLI answers
                while not stop.is_set():
                    p = s.ps().get(w.pid)
                    if p and p["bytes"] < low["v"]:
                        low["v"], low["p"] = p["bytes"], p
            t = threading.Thread(target=sample, daemon=True)
            t.start()
            try:
                rss0 = rss_anon(w.pid)
                # 64 MiB with 64 MiB of its own PROT_NONE after it, so
                # that calls wider than the mapping reach nothing else
                # (a hole could be mapped by the allocator meanwhile).
                say(w, "map_lazy 128")
                say(w, "guard_half")
                say(w, "touch 0 16")
                held = rss_anon(w.pid) - rss0
                # Counted for what it touched, not for all it mapped.
                p = mapped_near(s, w, base["mapped"] + held,
                                "16 of 64 MiB counted")
                check(p["mapped"] - base["mapped"] <= 16 * MIB + SLACK,
                      f"untouched pages not counted: {p}")
                # Give back far more than it holds: a madvise wider than
                # the mapping (ENOMEM past its end), a mapping PROT_NONE
                # over it and beyond, munmap of it twice and wider.
                say(w, "advise 0 128 dontneed")
                say(w, "unmap_wide 0 96")
                say(w, "unmap_wide 0 96")
                say(w, "map_lazy 16")
                say(w, "guard_half")
                say(w, "touch 0 8")
                say(w, "advise 0 16 dontneed")
                say(w, "unmap_wide 0 16")
                end = deadline(2)
                while time.monotonic() < end:
                    say(w, "flush")
                p = wait_for("back to its start", lambda: (
                    lambda p: p if p and p["mapped"] == base["mapped"]
                    else None)(s.ps().get(w.pid)))
            finally:
                stop.set()
                t.join()
            check(low["p"] is None,
                  f"never below its start ({start}): {low['p']}")
            check(p["bytes"] >= start, f"not below its start: {p}")
        finally:
            w.close()


if __name__ == "__main__":
    run([test_dontneed_then_touched_again, test_gives_back_more_than_counted,
         test_read_only_pages_not_held])
