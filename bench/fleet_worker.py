"""One task of a simulated fleet in Python (bench/fleet.py): the profiles of
tests/integration/workers/fleet.c, its memory held as 1 MiB bytes
objects (filled, so the kernel charges every page), under the preload.

    python3 fleet_worker.py PROFILE PEAK_MIB SECONDS [CPU_FRACTION]

PEAK_MIB is the whole process's peak: the interpreter's own ~10 MiB are
taken off what it allocates.
"""
import sys
import time

BASE_MIB = 10
MIB = 1 << 20
# A bytes object's header is 33 bytes: MIB of them would be 1 MiB + 33 and
# jemalloc's next size class (1.25 MiB). Just under 1 MiB fills its class.
CHUNK = MIB - 64


def level(profile, peak, f):
    if profile == "ramp":
        return peak if f >= 0.4 else peak * f / 0.4
    if profile == "spike":
        return peak if 0.45 <= f < 0.6 else 0.3 * peak
    if profile == "leak":
        return peak * (0.2 + 0.8 * f)
    return peak


def main():
    profile, peak, secs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    cpu = float(sys.argv[4]) if len(sys.argv) > 4 else 0.1
    peak = max(2.0, peak - BASE_MIB)
    blocks = []
    t0 = time.monotonic()
    step = 0.02
    while True:
        f = (time.monotonic() - t0) / secs
        if f >= 1:
            break
        want = int(level(profile, peak, f))
        while len(blocks) < want:
            blocks.append(b"\x01" * CHUNK)
        del blocks[want:]
        end = time.monotonic() + step * cpu
        n = 0
        while time.monotonic() < end:
            n += 1
        time.sleep(step * (1 - cpu))
    blocks.clear()


if __name__ == "__main__":
    main()
