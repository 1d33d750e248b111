"""Hostile peers on memtallyd's socket: bad input of every kind.

Each attack runs against one real memtallyd while a well-behaved client
issues GetUsage on its own connection from a process of its own, timing
every round trip. Each attacker must get an error response and/or be
disconnected; after every attack the server is still up and answers. The
well-behaved client's median latency during each attack stays within 2x of
its median just before it (+ a small allowance; see LAT_ALLOW), its p99
over the run under a generous bound (1 s: the box is a loaded 2-core
machine), and the server's RSS within a bound. test_global_buffer_cap:
64 peers pipelining without reading against a low --max-buffered; the
server's RSS stays within a bound computed from the cap.
test_connection_limit: --max-connections. attack_many_fields: requests
of 32,000 fields, refused before they are decoded. Figures are printed (see
tests/RESULTS.md). test_a_hostile_comm: a worker whose program name
(its comm, any bytes) is not UTF-8 and holds an escape: memtallyd shows
it with '?' for each such byte, so that strict protobuf decoders (the
Python client) still read the answers, and terminals print it inert.

MEMTALLY_LONG=1 makes every attack heavier (more connections, more bytes).
"""
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (MIB, MULT, NOBODY, NOGROUP, Server, check,  # noqa: E402
                     run, wait_for)
import pbwire as pb  # noqa: E402

LONG = os.environ.get("MEMTALLY_LONG") == "1"
SCALE = 10 if LONG else 1
PIPELINERS = 16 if LONG else 8
# Back-pressure holds each connection's unwritten output to MTS_OUT_HIGH
# (4 MiB) plus a turn: allow 5 MiB a pipelining peer, and 24 MiB for the
# rest (64 MiB in the short run).
RSS_GROWTH_MAX = (PIPELINERS * 5 + 24) * MIB
P99_MAX = 1.0 * MULT
T = 10 * MULT  # per-response deadline

results = []  # (attack, outcome) lines for the report


def sanitized():
    """Whether memtallyd is built with ASan/TSan: their quarantine and
    shadow memory make its RSS meaningless as a bound."""
    from harness import MEMTALLYD
    with open(MEMTALLYD, "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"__tsan_init" in data


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def connect(srv):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(srv.socket)
    return s


class Prober:
    """A well-behaved client: GetUsage every 10 ms, timing each answer.

    It runs in a process of its own (forked), not a thread: the attacks
    run Python loops in this process, and a prober thread would wait for
    the GIL (5 ms switch interval) and time that, not the server. Samples
    are (start, seconds) with start on CLOCK_MONOTONIC, which both
    processes share, so they can be split into windows afterwards."""

    def __init__(self, srv):
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        self.srv = srv
        self.stop_ev = ctx.Event()
        self.count = ctx.Value("l", 0)  # samples so far, read by windows
        self.rx, tx = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=self._run, args=(tx,), daemon=True)
        self.lat = []  # (start, seconds), filled by join()
        self.failure = None

    def start(self):
        """Start, and return once the first answer came back (forking and
        connecting must not fall into the first window)."""
        self.proc.start()
        wait_for("the prober's first answer",
                 lambda: self.count.value > 0 or not self.proc.is_alive(),
                 timeout=30)

    def wait_samples(self, n, timeout=30):
        """Wait until n more samples are taken (a window of n samples)."""
        target = self.count.value + n
        wait_for(f"{n} prober samples",
                 lambda: self.count.value >= target or not self.proc.is_alive(),
                 timeout=timeout)

    def samples(self):
        return self.count.value

    def _run(self, tx):
        lat, failure = [], None
        try:
            s = connect(self.srv)
            r = pb.Reader(s)
            i = 0
            while not self.stop_ev.is_set():
                i += 1
                t0 = time.monotonic()
                s.sendall(pb.get_usage(i))
                resp = r.frame(T)
                dt = time.monotonic() - t0
                if resp is None or pb.error_code(resp) or 4 not in resp:
                    raise AssertionError(f"bad GetUsage answer: {resp!r}")
                if resp[1][0] != i:
                    raise AssertionError(f"answer id {resp[1][0]} != {i}")
                lat.append((t0, dt))
                with self.count.get_lock():
                    self.count.value += 1
                self.stop_ev.wait(0.01)
            s.close()
        except Exception as e:  # noqa: BLE001
            failure = repr(e)
        tx.send((lat, failure))
        tx.close()

    def stop(self):
        self.stop_ev.set()
        if self.rx.poll(30 * MULT):
            self.lat, self.failure = self.rx.recv()
        else:
            self.failure = "prober sent nothing back"
        self.proc.join(timeout=10)

    def window(self, t0, t1):
        return [dt for (t, dt) in self.lat if t0 <= t < t1]

    def quantile(self, q, xs=None):
        xs = sorted(xs if xs is not None else [dt for _, dt in self.lat])
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def alive(srv):
    """The server is running and answers a fresh GetUsage."""
    check(srv.proc.poll() is None, "memtallyd died: " + srv.logtext()[-3000:])
    s = connect(srv)
    try:
        s.sendall(pb.get_usage(4242))
        resp = pb.Reader(s).frame(T)
        check(resp is not None and 4 in resp, f"no usage answer: {resp!r}")
    finally:
        s.close()


def expect_error_then_close(s, codes, what):
    frames = pb.Reader(s).until_eof(T)
    got = [pb.error_code(f) for f in frames]
    check(frames and got[-1] in codes,
          f"{what}: expected an error {codes} then EOF, got {got}")
    return got


# ---- attacks ---------------------------------------------------------------

def attack_random_bytes(srv):
    closed = answered = 0
    rng = random.Random(5)
    for _ in range(20 * SCALE):
        s = connect(srv)
        try:
            s.sendall(bytes(rng.getrandbits(8) for _ in range(4096)))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us mid-send: fine
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        frames = pb.Reader(s).until_eof(T)
        answered += sum(1 for f in frames if pb.error_code(f))
        closed += 1
        s.close()
    return f"{closed} conns x 4 KiB random: all closed, {answered} error answers"


def attack_huge_prefix(srv):
    s = connect(srv)
    s.sendall(pb.varint(1 << 40) + b"\0" * 16)
    got = expect_error_then_close(s, {pb.ERROR_FRAME_TOO_LARGE}, "2^40 prefix")
    s.close()
    return f"length prefix 2^40: error {got[-1]} (FRAME_TOO_LARGE), closed"


def attack_endless_varint(srv):
    s = connect(srv)
    sent = 0
    try:
        # Keep the varint going until the server hangs up.
        end = time.monotonic() + T
        while time.monotonic() < end:
            s.sendall(b"\xff" * 64)
            sent += 64
            if sent >= 64 * 1024:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    got = expect_error_then_close(s, {pb.ERROR_UNDECODABLE}, "endless varint")
    s.close()
    return f"endless varint (0xff...): error {got[-1]} (UNDECODABLE), closed"


def attack_zero_length(srv):
    s = connect(srv)
    s.sendall(b"\x00" * 100)
    s.shutdown(socket.SHUT_WR)
    frames = pb.Reader(s).until_eof(T)
    codes = [pb.error_code(f) for f in frames]
    check(len(frames) >= 1, "zero-length frames: no answer at all")
    check(all(c == pb.ERROR_INVALID_REQUEST for c in codes[:1]),
          f"zero-length frames: {codes[:5]}")
    s.close()
    return (f"100 zero-length frames: {len(frames)} answers, codes "
            f"{sorted(set(codes))}, closed at EOF")


def attack_truncated(srv):
    n = 0
    full = pb.get_usage(1)
    for cut in range(1, len(full)):
        s = connect(srv)
        s.sendall(full[:cut])
        s.shutdown(socket.SHUT_WR)
        frames = pb.Reader(s).until_eof(T)
        check(frames == [], f"truncated at {cut}: answered {frames}")
        s.close()
        n += 1
    # A frame announcing 1000 bytes, 10 sent, then the peer hangs up.
    s = connect(srv)
    s.sendall(pb.varint(1000) + b"x" * 10)
    s.shutdown(socket.SHUT_WR)
    check(pb.Reader(s).until_eof(T) == [], "short body answered")
    s.close()
    return f"{n + 1} truncated frames then EOF: no answer, closed"


def attack_undecodable(srv):
    bodies = [b"\xff\xff\xff", b"\x0a\x05ab", b"\x08", b"\x22\x7f",
              bytes(range(0x80, 0xa0))]
    for b in bodies:
        s = connect(srv)
        s.sendall(pb.frame(b) + pb.get_usage(2))  # the second is never answered
        got = expect_error_then_close(s, {pb.ERROR_UNDECODABLE}, f"body {b!r}")
        check(len(got) == 1, f"answered past an undecodable frame: {got}")
        s.close()
    return f"{len(bodies)} undecodable bodies: UNDECODABLE, closed, rest unread"


def attack_many_fields(srv):
    """Requests of the largest size (64 KiB) made of 2-byte unknown fields,
    from 4 connections at once: decoding one took the server ~10 ms (150
    ms at the 1 MiB requests once allowed); checking it takes
    microseconds."""
    body = b"\x08\x01" + b"\x78\x00" * (64000 // 2 - 1)
    conns = [connect(srv) for _ in range(4 * SCALE)]
    for s in conns:
        try:
            s.sendall(pb.frame(body))
        except (BrokenPipeError, ConnectionResetError):
            pass
    for s in conns:
        expect_error_then_close(s, {pb.ERROR_UNDECODABLE}, "many fields")
        s.close()
    return (f"{len(conns)} conns x 64 KB of 2-byte fields: UNDECODABLE, "
            "closed")


def attack_pipelined(srv):
    """Thousands of requests per connection, answers never read."""
    conns = []
    frames = 0
    payload = b"".join(pb.get_usage(i) for i in range(1, 2001))
    ncon = PIPELINERS
    for _ in range(ncon):
        s = connect(srv)
        s.setblocking(False)
        conns.append(s)
    end = time.monotonic() + (20 if LONG else 4) * MULT
    sent = [0] * ncon
    evicted = set()
    while time.monotonic() < end:
        progress = False
        for k, s in enumerate(conns):
            if k in evicted:
                continue
            try:
                n = s.send(payload)
                sent[k] += n
                progress = progress or n > 0
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                # The server-wide budget (max_buffered, 64 MiB by
                # default) disconnected the largest holder: 16 peers x
                # 4 MiB of unread output reach it in the long variant.
                evicted.add(k)
        if not progress:
            time.sleep(0.01)  # everyone is blocked: back-pressure holds
    frames = sum(sent) // len(pb.get_usage(1000))
    peak = rss(srv.proc.pid)
    for s in conns:
        s.close()
    # Only the budget may disconnect, and only while over it: never
    # most of the peers (each holds at most its 4 MiB, the cap is 64).
    check(len(evicted) <= ncon // 2,
          f"{len(evicted)} of {ncon} pipelining peers disconnected")
    return (f"{ncon} conns pipelining GetUsage unread for "
            f"{(20 if LONG else 4)} s: ~{frames} requests accepted "
            f"({sum(sent) // 1024} KiB) before back-pressure, "
            f"{len(evicted)} disconnected by the server-wide budget; "
            f"server RSS {peak / MIB:.1f} MiB meanwhile"), peak


def attack_slowloris(srv):
    """One byte every 50 ms, on several connections at once: each still
    gets its answers."""
    nconn = 4 * SCALE
    msgs = [pb.get_usage(7) + pb.get_usage(8) for _ in range(nconn)]
    socks = [connect(srv) for _ in range(nconn)]
    t0 = time.monotonic()
    for pos in range(len(msgs[0])):
        for s, m in zip(socks, msgs):
            s.sendall(m[pos:pos + 1])
        time.sleep(0.05)  # the attack's pacing, not a synchronisation
    for s in socks:
        r = pb.Reader(s)
        a, b = r.frame(T), r.frame(T)
        check(a and b and a[1][0] == 7 and b[1][0] == 8,
              f"slow peer answers: {a!r} {b!r}")
        s.close()
    return (f"{nconn} conns at 1 byte / 50 ms ({len(msgs[0])} bytes each, "
            f"{time.monotonic() - t0:.1f} s): all answered correctly")


def attack_many_idle(srv):
    n = 200 * (2 if LONG else 1)
    socks = []
    for _ in range(n):
        socks.append(connect(srv))
    alive(srv)
    for s in socks:
        s.close()
    return f"{n} idle connections held open: server answers others"


# Latency of the well-behaved client during an attack vs. just before it.
# Each attack gets a window of its own with no attack (WINDOW samples,
# ~0.6 s) right before it, and runs (repeated if it is short) until at
# least ATTACK_S have passed and WINDOW samples were taken during it, so
# both medians come from 50+ samples of the same run and machine load
# (counted, not timed: on an overloaded box 0.6 s may hold 9 samples).
# Asserted: median during <= 2 x median before + LAT_ALLOW, in at least
# one of up to LAT_ROUNDS rounds (a round = a fresh normal window and a
# fresh attack window). Why this shape:
#  - medians, not p99: on a loaded 2-core box a few samples of either
#    window wait for the scheduler, and a p99 ratio of two ~50-sample
#    windows would flake (p99 ratios are recorded in tests/RESULTS.md and
#    the whole run's p99 is bounded loosely by P99_MAX);
#  - the absolute allowance: 2x of a ~0.1 ms median is below the noise of
#    a Python client on a busy machine;
#  - rounds: a burst of load from another test can spoil one round; a
#    server that really stalls (a loop blocked on a slow peer: tens of ms
#    per probe; a turn that answers thousands of pipelined frames: ms)
#    fails every round, so the test still fails then.
WINDOW = 50
ATTACK_S = 0.6
LAT_ALLOW = 0.002 * MULT
LAT_ROUNDS = 5


def test_hostile_peers():
    with Server() as srv:
        alive(srv)
        rss0 = rss(srv.proc.pid)
        prober = Prober(srv)
        prober.start()
        peak = rss0
        rounds = []  # (attack, round, normal (t0, t1), attack (t0, t1))

        def one_round(attack, k):
            nonlocal peak
            n0 = time.monotonic()
            prober.wait_samples(WINDOW)
            t0 = time.monotonic()
            c0 = prober.samples()
            runs = 0
            while True:
                out = attack(srv)
                runs += 1
                if isinstance(out, tuple):
                    out, p = out
                    peak = max(peak, p)
                if (time.monotonic() - t0 >= ATTACK_S
                        and prober.samples() - c0 >= WINDOW):
                    break
                check(time.monotonic() - t0 < 60 * MULT,
                      f"{attack.__name__}: the prober took no samples")
            t1 = time.monotonic()
            alive(srv)
            peak = max(peak, rss(srv.proc.pid))
            rounds.append((attack.__name__, k, (n0, t0), (t0, t1)))
            if k == 0:
                results.append((attack.__name__, out, t1 - t0))
                print(f"  {attack.__name__} (x{runs}): {out}", flush=True)

        attacks = (attack_random_bytes, attack_huge_prefix,
                   attack_endless_varint, attack_zero_length,
                   attack_truncated, attack_undecodable,
                   attack_many_fields, attack_pipelined,
                   attack_slowloris, attack_many_idle)
        for attack in attacks:
            one_round(attack, 0)
        # The prober's samples are only read at the end: judge the rounds
        # then, and run more rounds of the attacks that failed.
        prober.stop()
        check(prober.failure is None, f"well-behaved client: {prober.failure}")

        def judge(name, k, norm_w, att_w):
            norm, dur = prober.window(*norm_w), prober.window(*att_w)
            nm, np99 = prober.quantile(.5, norm), prober.quantile(.99, norm)
            dm, dp99 = prober.quantile(.5, dur), prober.quantile(.99, dur)
            print(f"    {name} [{k}]: {nm * 1e3:.2f}/{np99 * 1e3:.2f} "
                  f"({len(norm)}) -> {dm * 1e3:.2f}/{dp99 * 1e3:.2f} "
                  f"({len(dur)}); x{dm / nm:.2f}, x{dp99 / np99:.2f}",
                  flush=True)
            check(len(norm) >= 10 and len(dur) >= 10,
                  f"{name}: too few samples ({len(norm)}, {len(dur)})")
            return dm <= 2 * nm + LAT_ALLOW, (nm, dm)

        all_lat = list(prober.lat)
        print("  GetUsage latency, ms: attack [round]: normal p50/p99 (n) "
              "-> during p50/p99 (n); ratio p50, p99", flush=True)
        failing = {}
        for name, k, nw, aw in rounds:
            ok, fig = judge(name, k, nw, aw)
            if not ok:
                failing[name] = fig
        for k in range(1, LAT_ROUNDS):
            if not failing:
                break
            rounds.clear()
            prober = Prober(srv)
            prober.start()
            for attack in attacks:
                if attack.__name__ in failing:
                    one_round(attack, k)
            prober.stop()
            check(prober.failure is None,
                  f"well-behaved client: {prober.failure}")
            all_lat += prober.lat
            for name, k2, nw, aw in rounds:
                ok, fig = judge(name, k2, nw, aw)
                if ok:
                    del failing[name]
                else:
                    failing[name] = fig
        why = "; ".join(f"{n}: median {d * 1e3:.2f} ms during vs "
                        f"{m * 1e3:.2f} ms before"
                        for n, (m, d) in failing.items())
        if sanitized():
            # ASan/TSan slow the server unevenly, connection-heavy
            # attacks most (under TSan 200 idle connections opened at
            # once: 5.8 -> 24 ms median): the ratio would measure the
            # sanitizer. Recorded only.
            if failing:
                print("  (sanitized build: latency ratio not checked: "
                      + why + ")", flush=True)
        else:
            check(not failing, "latency more than 2x normal in every "
                  "round: " + why)
        rss1 = rss(srv.proc.pid)
        print(f"  server RSS: start {rss0 / MIB:.1f} MiB, peak {peak / MIB:.1f}"
              f" MiB, end {rss1 / MIB:.1f} MiB", flush=True)
        lat = sorted(dt for _, dt in all_lat)
        p99 = lat[min(len(lat) - 1, int(.99 * len(lat)))]
        print(f"  GetUsage latency, whole run: n={len(lat)} "
              f"p50={lat[len(lat) // 2] * 1e3:.2f} ms "
              f"p99={p99 * 1e3:.2f} ms max={lat[-1] * 1e3:.2f} ms",
              flush=True)
        check(p99 < P99_MAX, f"p99 {p99:.3f} s over {P99_MAX} s")
        if sanitized():
            print("  (sanitized build: RSS bound not checked)", flush=True)
        else:
            check(peak - rss0 < RSS_GROWTH_MAX,
                  f"RSS grew {(peak - rss0) / MIB:.1f} MiB")
        st = srv.status()
        check(st["processes"] == 0 and st["fleet"]["bytes"] == 0,
              f"attacks changed the counts: {st}")


# The server-wide budget: many peers pipelining without reading, against a
# low --max-buffered. Each would hold up to ~4.6 MiB on its own bound; the
# cap keeps the sum to about the cap (the largest are throttled, then
# disconnected), and a well-behaved client is answered throughout.
CAP_PEERS = 128 if LONG else 64
CAP = 8 * MIB
# The cap, plus the allocator's slack around what it counts (freed blocks
# of evicted peers, per-write headers), plus libuv and the rest.
CAP_RSS_GROWTH_MAX = 2 * CAP + 16 * MIB


def pipeline_unread(srv, npeers, seconds):
    payload = b"".join(pb.get_usage(i) for i in range(1, 2001))
    conns = []
    for _ in range(npeers):
        s = connect(srv)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        conns.append(s)
    sent = [0] * npeers
    closed = 0
    peak = rss(srv.proc.pid)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        progress = False
        for k, s in enumerate(conns):
            if s is None:
                continue
            try:
                n = s.send(payload)
                sent[k] += n
                progress = progress or n > 0
            except BlockingIOError:
                pass
            except OSError:  # disconnected by the server
                s.close()
                conns[k] = None
                closed += 1
        peak = max(peak, rss(srv.proc.pid))
        if not progress:
            time.sleep(0.01)  # everyone is blocked: back-pressure holds
    for s in conns:
        if s is not None:
            s.close()
    return sum(sent), closed, peak


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    return None


def test_global_buffer_cap():
    with Server("--max-buffered", f"{CAP // MIB}MiB",
                "--max-connections", "4096") as srv:
        alive(srv)
        rss0 = rss(srv.proc.pid)
        prober = Prober(srv)
        prober.start()
        prober.wait_samples(WINDOW)
        t0 = time.monotonic()
        total, closed, peak = pipeline_unread(srv, CAP_PEERS,
                                              (12 if LONG else 4) * MULT)
        t1 = time.monotonic()
        alive(srv)
        prober.stop()
        check(prober.failure is None, f"well-behaved client: {prober.failure}")
        norm, dur = prober.window(0, t0), prober.window(t0, t1)
        nm, dm = prober.quantile(.5, norm), prober.quantile(.5, dur)
        log = srv.logtext()
        throttled = log.count("throttling the largest")
        evicted = log.count("did not drain; disconnected")
        out = (f"{CAP_PEERS} conns pipelining unread, max_buffered "
               f"{CAP // MIB} MiB: {total // 1024} KiB sent, {evicted} "
               f"evicted ({closed} saw it while sending), RSS "
               f"{rss0 / MIB:.1f} -> {peak / MIB:.1f} MiB; GetUsage p50 "
               f"{nm * 1e3:.2f} -> {dm * 1e3:.2f} ms, p99 "
               f"{prober.quantile(.99, norm) * 1e3:.2f} -> "
               f"{prober.quantile(.99, dur) * 1e3:.2f} ms (n={len(dur)})")
        print("  " + out, flush=True)
        results.append(("global_buffer_cap", out, t1 - t0))
        check(throttled >= 1, "the cap was never reached: no throttling log")
        check(evicted >= 1, "nobody was disconnected")
        check(len(dur) >= 10, f"too few samples during the attack: {len(dur)}")
        # Answered throughout (the prober fails on a missing answer) and
        # within P99_MAX; the medians are recorded, not held to 2x here:
        # the attacker keeps 64 sockets busy from one Python loop and, on
        # a 2-core box shared with other tests, takes the server's CPU
        # (measured: x1.0 alone, up to ~x30 of a 0.1 ms median under
        # `ctest -j2`). test_hostile_peers holds every attack to 2x.
        p99 = prober.quantile(.99, dur)
        check(p99 < P99_MAX, f"p99 {p99:.3f} s during the attack")
        if sanitized():
            print("  (sanitized build: RSS bound not checked)", flush=True)
        else:
            check(peak - rss0 < CAP_RSS_GROWTH_MAX,
                  f"RSS grew {(peak - rss0) / MIB:.1f} MiB with a cap of "
                  f"{CAP // MIB} MiB (bound {CAP_RSS_GROWTH_MAX // MIB} MiB)")
        # Everyone gone: nothing is held any more.
        wait_for("pressure to end",
                 lambda: "buffered bytes back under budget" in srv.logtext(),
                 timeout=20)


def test_connection_limit():
    with Server("--max-connections", "8") as srv:
        # One at a time, each answered: the harness's own probe of the
        # socket may not be closed on the server's side yet, and would
        # take a place.
        socks = [wait_for("a connection served", lambda: _served(srv))
                 for _ in range(8)]
        # The ninth is accepted and closed at once: EOF, no answer.
        extra = connect(srv)
        try:
            extra.sendall(pb.get_usage(2))
        except (BrokenPipeError, ConnectionResetError):
            pass
        check(pb.Reader(extra).until_eof(T) == [],
              "a connection past max_connections was answered")
        extra.close()
        wait_for("rejection logged",
                 lambda: "max_connections reached" in srv.logtext())
        # One goes, and there is room again.
        socks.pop().close()
        wait_for("a free connection", lambda: _answered(srv))
        for s in socks:
            s.close()
        results.append(("connection_limit", "max_connections 8: the 9th "
                        "closed at once with no answer, logged; room again "
                        "after one closed", 0))


# One uid's many connections, each pipelining and reading its answers (so
# that no output bound holds it back), against the loop's other work: the
# tick, and another uid's requests. Each connection got 64 frames a loop
# iteration, so one uid's 120 took 7,680 answers an iteration: the tick
# fell from ~100 to ~5 a second and another user's GetUsage took ~300 ms.
GREEDY_CONNS = 120  # under max_connections_per_uid (1024 / 8)
GREEDY_GROUPS = 200  # each answer the size a busy fleet's is


def _greedy(path, nconn, seconds, tx):
    import selectors
    got = 0
    try:
        os.setgroups([])
        os.setgid(NOGROUP)
        os.setuid(NOBODY)
        batch = b"".join(pb.get_usage(i) for i in range(1, 65))
        sel = selectors.DefaultSelector()
        todo = {}
        for _ in range(nconn):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.setblocking(False)
            todo[s] = b""
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        tx.send(("ready", 0))
        end = time.monotonic() + seconds
        while time.monotonic() < end and todo:
            for key, ev in sel.select(0.1):
                s = key.fileobj
                if s not in todo:
                    continue
                try:
                    if ev & selectors.EVENT_READ:
                        d = s.recv(1 << 20)
                        if not d:
                            raise ConnectionError("closed")
                        got += len(d)
                    if ev & selectors.EVENT_WRITE:
                        if not todo[s]:
                            todo[s] = batch
                        todo[s] = todo[s][s.send(todo[s]):]
                except BlockingIOError:
                    pass
                except OSError:
                    sel.unregister(s)
                    del todo[s]
        tx.send(("done", got))
    except Exception as e:  # noqa: BLE001
        tx.send(("failed", repr(e)))


def _loop_figures(srv, seconds):
    """(ticks a second, median GetUsage round trip) seen by root, one
    request every 20 ms on a connection of its own."""
    s = connect(srv)
    r = pb.Reader(s)
    lat, ticks = [], []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        t0 = time.monotonic()
        s.sendall(pb.get_usage(i))
        resp = r.frame(T)
        lat.append(time.monotonic() - t0)
        check(resp is not None and 4 in resp, f"no usage answer: {resp!r}")
        ticks.append((time.monotonic(), pb.parse(resp[4][0]).get(12, [0])[0]))
        time.sleep(0.02)
    s.close()
    rate = (ticks[-1][1] - ticks[0][1]) / (ticks[-1][0] - ticks[0][0])
    lat.sort()
    return rate, lat[len(lat) // 2]


def test_one_uid_cannot_take_the_loop():
    import multiprocessing as mp
    from harness import config_file, open_to_nobody
    conf = config_file("[server]\ngroup = 65534\n")
    with Server("--config", conf) as srv:
        open_to_nobody(srv)
        s = connect(srv)
        r = pb.Reader(s)
        for i in range(GREEDY_GROUPS):
            s.sendall(pb.request(i + 1, pb.SET_LIMIT, pb.field(
                2, 2, b"g%d" % i) + pb.field(4, 0, 1 << 30)))
        for i in range(GREEDY_GROUPS):
            resp = r.frame(T)
            check(resp is not None and not pb.error_code(resp),
                  f"SetLimit of a group: {resp!r}")
        s.close()
        rate0, lat0 = _loop_figures(srv, 2 * MULT)
        ctx = mp.get_context("fork")
        rx, tx = ctx.Pipe(duplex=False)
        seconds = 8 * MULT
        p = ctx.Process(target=_greedy, daemon=True,
                        args=(srv.socket, GREEDY_CONNS, seconds, tx))
        p.start()
        try:
            check(rx.poll(30 * MULT), "the greedy peer did not start")
            what, _ = rx.recv()
            check(what == "ready", f"greedy peer: {what} {_}")
            time.sleep(0.5 * MULT)  # its batches in flight
            rate1, lat1 = _loop_figures(srv, 3 * MULT)
            check(rx.poll(seconds + 30 * MULT), "the greedy peer hung")
            what, got = rx.recv()
        finally:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        check(what == "done", f"greedy peer: {what} {got}")
        alive(srv)
        print(f"  {GREEDY_CONNS} connections of nobody pipelining GetUsage "
              f"({GREEDY_GROUPS} groups) and reading {got / MIB:.0f} MiB of "
              f"answers: ticks {rate0:.0f}/s -> {rate1:.0f}/s, root's "
              f"GetUsage median {lat0 * 1e3:.2f} -> {lat1 * 1e3:.2f} ms",
              flush=True)
        check(got > 0, "the greedy peer was never answered")
        check(rate1 >= rate0 / 4,
              f"the tick ran {rate1:.1f} times a second under one uid's "
              f"connections, {rate0:.1f} before")
        if not sanitized():
            check(lat1 < 0.05 * MULT,
                  f"root's GetUsage took {lat1 * 1e3:.0f} ms (median) "
                  f"under one uid's connections")
        results.append(("one_uid_cannot_take_the_loop",
                        f"{GREEDY_CONNS} conns of one uid: ticks "
                        f"{rate0:.0f}/s -> {rate1:.0f}/s", 0))


def _served(srv):
    """A connection that got an answer (kept open), or None."""
    s = connect(srv)
    try:
        s.sendall(pb.get_usage(1))
        f = pb.Reader(s).frame(2 * MULT)
        if f is not None and 4 in f:
            return s
    except OSError:
        pass
    s.close()
    return None


def _answered(srv):
    s = connect(srv)
    try:
        s.sendall(pb.get_usage(3))
        f = pb.Reader(s).frame(2 * MULT)
        return f is not None and 4 in f
    except OSError:
        return False
    finally:
        s.close()


def test_a_hostile_comm():
    import shutil
    import subprocess
    import tempfile
    from harness import worker
    d = tempfile.mkdtemp(prefix="mt-comm-")
    prog = os.path.join(os.fsencode(d), b"\xff\xfe\x1b[31mw")
    shutil.copy(worker("hold")[0], prog)
    sys.path.insert(0, os.environ.get("MEMTALLY_PYTHON", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")))
    from memtally import client as mc
    with Server() as s:
        w = subprocess.Popen([prog, *worker("hold")[1:], "8"], env=s.env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        try:
            check(w.stdout.readline().startswith("ready"), "not ready")
            wait_for("the worker registered", lambda: w.pid in s.ps(),
                     timeout=20)
            comm = s.ps()[w.pid]["comm"]
            check(comm == "???[31mw", f"comm {comm!r}")
            try:
                got = [p.comm for p in mc.Client(s.socket).processes()]
            except Exception as e:  # the old server: a DecodeError
                raise AssertionError(f"the Python client cannot read the "
                                     f"process list: {e}")
            check("???[31mw" in got, f"comms {got}")
            print(f"  comm shown as {comm!r}, readable by the Python "
                  f"client", flush=True)
        finally:
            w.stdin.close()
            w.wait()
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    run([test_hostile_peers, test_global_buffer_cap, test_connection_limit,
         test_one_uid_cannot_take_the_loop,
         test_a_hostile_comm])
