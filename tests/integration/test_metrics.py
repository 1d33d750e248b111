"""Prometheus endpoint: memtallyd --metrics serves
/metrics with the fleet, group and process figures of live workers and its
counters, in a text that `promtool check metrics` accepts without a word;
other paths are 404, other methods 405; a bad address stops the server;
a flood of malformed requests leaves a few log lines, not one each."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from harness import (MEMTALLYD, MIB, MULT, Ends, Server, Skip, Worker, check,
                     config_file, run, wait_for, worker)

HERE = os.path.dirname(os.path.abspath(__file__))
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def unescape(v):
    return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n"
                  else m.group(1), v)


def parse(text):
    """{(name, ((label, value), ...)): float} of every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        check(m is not None, f"not a sample line: {line!r}")
        labels = tuple(sorted((k, unescape(v))
                              for k, v in LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def metrics_url(s):
    """The address memtallyd logged for --metrics ...:0 (the last one)."""
    found = re.findall(r'msg="metrics listening" addr=(\S+)', s.logtext())
    return f"http://{found[-1]}/metrics" if found else None


def get(url, method="GET"):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10 * MULT) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def promtool(text):
    check(os.access(PROMTOOL, os.X_OK),
          "promtool not found: scripts/deps.sh installs it (prometheus)")
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                       capture_output=True, timeout=60 * MULT)
    said = (r.stdout + r.stderr).decode()
    check(r.returncode == 0 and not said.strip(),
          f"promtool check metrics: exit {r.returncode}: {said}")


class Namespace:
    """A network namespace of its own, set up by `cmds` (each run inside
    it), so the host's addresses and sysctls are not touched; removed at
    exit. Skip (77) where it cannot be made (not root, no `ip netns`) or
    set up (`why`: what the commands were for)."""

    def __init__(self, tag, cmds, why):
        self.ns = f"{tag}{os.getpid() % 100000}"
        self.cmds, self.why = cmds, why
        self.inns = ["ip", "netns", "exec", self.ns]

    def __enter__(self):
        if os.geteuid() != 0:
            raise Skip("needs root for a network namespace")
        if subprocess.run(["ip", "netns", "add", self.ns],
                          capture_output=True).returncode != 0:
            raise Skip("cannot make a network namespace (ip netns add)")
        for cmd in [["ip", "link", "set", "lo", "up"]] + self.cmds:
            r = subprocess.run(self.inns + cmd, capture_output=True,
                               text=True)
            if r.returncode != 0:
                self.__exit__()
                raise Skip(f"cannot {self.why}: {' '.join(cmd)}: "
                           f"{r.stderr.strip()}")
        return self.inns

    def __exit__(self, *exc):
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


def test_live_worker():
    """A preloaded worker holding 32 MiB in group `metrics-it`: its group
    and process gauges show it, registrations count it, promtool is
    content; after it exits its series go and reclaims count it. (Per-process
    series are opted in: [metrics] per_process.)"""
    conf = config_file("[metrics]\nper_process = true\n")
    with Server("--config", conf, "--metrics", "127.0.0.1:0") as s:
        url = wait_for("metrics listening log line", lambda: metrics_url(s))
        w = Worker([*worker("hold"), "32"], s.env(group="metrics-it"))
        try:
            check(w.readline().startswith("ready"), "worker not ready")

            def counted():
                st, hdr, body = get(url)
                if st != 200:
                    return None
                m = parse(body)
                g = value(m, "memtally_group_accounted_bytes",
                          group="metrics-it")
                return (hdr, body, m) if g and g >= 32 * MIB else None

            hdr, body, m = wait_for("group gauge >= 32 MiB", counted)
            check(hdr.get("Content-Type") == CONTENT_TYPE,
                  f"Content-Type {hdr.get('Content-Type')!r}")
            check(value(m, "memtally_registrations_total") >= 1,
                  "registrations_total < 1")
            check(value(m, "memtally_processes") == 1, "processes != 1")
            check(value(m, "memtally_group_processes",
                        group="metrics-it") == 1, "group processes != 1")
            check(value(m, "memtally_fleet_accounted_bytes") >= 32 * MIB,
                  "fleet gauge below the worker's 32 MiB")
            mine = [k for k in m if k[0] == "memtally_process_accounted_bytes"
                    and ("pid", str(w.pid)) in k[1]]
            check(len(mine) == 1, f"process series for {w.pid}: {mine}")
            check(("group", "metrics-it") in mine[0][1], f"{mine[0]}")
            check(m[mine[0]] >= 32 * MIB, f"process gauge {m[mine[0]]}")
            states = [k for k in m if k[0] == "memtally_fleet_state"]
            check(len(states) == 3 and sum(m[k] for k in states) == 1,
                  f"fleet_state is not one-hot: {states}")
            version = subprocess.run([MEMTALLYD, "--version"],
                                     capture_output=True, text=True,
                                     check=True).stdout.split()[1]
            check(value(m, "memtally_build_info", version=version) == 1,
                  "build_info")
            check(value(m, "memtally_tick_duration_seconds_count") > 0,
                  "no tick counted in memtally_tick_duration_seconds")
            promtool(body)
        finally:
            w.close()

        def gone():
            st, _, body = get(url)
            m = parse(body) if st == 200 else {}
            return m if (m and value(m, "memtally_processes") == 0 and
                         value(m, "memtally_reclaims_total") >= 1) else None

        m = wait_for("worker gone from /metrics", gone)
        check(not any(k[0].startswith("memtally_process_") for k in m),
              "process series outlive their worker")


def test_http_surface():
    """HEAD is GET without a body; other paths 404, other methods 405."""
    with Server("--metrics", "127.0.0.1:0") as s:
        url = wait_for("metrics listening log line", lambda: metrics_url(s))
        st, hdr, body = get(url)
        check(st == 200, f"GET {st}")
        promtool(body)
        st, hdr, head = get(url, "HEAD")
        check(st == 200 and head == "", f"HEAD {st} {head[:80]!r}")
        check(int(hdr["Content-Length"]) > 0, f"HEAD headers {hdr}")
        st, _, _ = get(url.replace("/metrics", "/"))
        check(st == 404, f"GET / {st}")
        st, hdr, _ = get(url, "POST")
        check(st == 405, f"POST {st}")
        check(hdr.get("Allow") == "GET, HEAD", f"Allow {hdr.get('Allow')}")


def test_bad_address_refused():
    """A --metrics memtallyd cannot serve is a failed start, not a
    silently missing endpoint."""
    d = tempfile.mkdtemp(prefix="mt-it-")
    try:
        r = subprocess.run([MEMTALLYD, "--socket", os.path.join(d, "sock"),
                            "--segment", f"mt-it-{os.getpid()}-badmetrics",
                            "--metrics", "no-port-here"],
                           capture_output=True, timeout=20 * MULT)
        check(r.returncode != 0, "memtallyd started with a bad --metrics")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_malformed_requests_do_not_flood_the_log():
    """libmicrohttpd logs a line or two per malformed request; a client
    of the port sending 200 of them must not write 200 lines."""
    import socket
    with Server("--metrics", "127.0.0.1:0") as s:
        url = wait_for("metrics listening log line", lambda: metrics_url(s))
        host, port = url.split("/")[2].rsplit(":", 1)
        before = s.logtext().count('msg="metrics http"')
        t0 = time.monotonic()
        for _ in range(200):
            c = socket.create_connection((host, int(port)), timeout=5)
            try:
                c.sendall(b"GET /metrics HTTP/1.1\r\nBad Header\r\n\r\n")
                c.recv(1024)
            except OSError:
                pass
            finally:
                c.close()
        took = time.monotonic() - t0
        time.sleep(1.5)  # the held-back lines' summary comes next second
        n = s.logtext().count('msg="metrics http"') - before
        # At most the scope's burst (5) each second, plus its summary.
        allowed = 6 * (int(took) + 3)
        check(0 < n <= allowed,
              f"{n} log lines for 200 malformed requests in {took:.1f} s "
              f"(allowed {allowed})")
        get(url)  # still serving
        print(f"  200 malformed requests in {took:.1f} s: {n} log lines",
              flush=True)


def scrape_from(host, port, source, timeout, token=None):
    """A GET /metrics from `source` (a loopback address of its own), with
    `token` as a bearer's if given: the status, or None when no answer
    came in `timeout` seconds."""
    import socket
    try:
        c = socket.create_connection((host, port), timeout=timeout,
                                     source_address=(source, 0))
    except OSError:
        return None
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    try:
        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"Connection: close\r\n\r\n")
        head = c.recv(64)
        return int(head.split()[1]) if head.startswith(b"HTTP/") else None
    except (OSError, ValueError, IndexError):
        return None
    finally:
        c.close()


def test_slow_clients_do_not_lock_out_a_scraper():
    """Clients that open connections and send a request's headers a byte
    at a time (each byte resets libmicrohttpd's idle timeout) held every
    connection it allowed for as long as they kept at it: 16 of them kept
    Prometheus out. One address gets 8 connections; every connection's
    headers must be in 5 s after it opened, or it is ended. 64 trickling
    clients from 64 addresses fill the server's connections; a scrape gets
    its answer once their time is up."""
    import socket
    import threading
    with Server("--metrics", "127.0.0.1:0") as s:
        url = wait_for("metrics listening log line", lambda: metrics_url(s))
        host, port = url.split("/")[2].rsplit(":", 1)
        port = int(port)
        # One address gets 8 connections: of 12, 4 are refused at once.
        same = Ends()
        for _ in range(12):
            c = socket.create_connection((host, port), timeout=5,
                                         source_address=("127.0.2.1", 0))
            c.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            same.add(c)
        same.wait(15)
        refused = same.refused_at_accept(8, 5.0)
        for c in same.conns:
            c.close()
        stop = threading.Event()
        slow, ended = [], []

        def trickle():
            while not stop.is_set():
                for c in list(slow):
                    try:
                        c.send(b"X")
                    except OSError:
                        slow.remove(c)
                        ended.append(c)
                stop.wait(1.0)
        for i in range(64):
            try:
                c = socket.create_connection(
                    (host, port), timeout=5,
                    source_address=(f"127.0.1.{10 + i}", 0))
                c.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
                slow.append(c)
            except OSError:
                pass
        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        t0 = time.monotonic()
        try:
            got = None
            while got != 200 and time.monotonic() - t0 < 20 * MULT:
                got = scrape_from(host, port, "127.0.3.1", 2 * MULT)
                if got != 200:
                    time.sleep(0.1)  # refused at once: not a busy loop
            took = time.monotonic() - t0
        finally:
            stop.set()
            t.join(timeout=10)
            for c in slow + ended:
                c.close()
        print(f"  64 trickling clients: a scrape answered {got} after "
              f"{took:.1f} s; {len(ended)} of them ended by the server; "
              f"{refused} of 12 from one address refused at once",
              flush=True)
        check(got == 200, f"no scrape answered in {took:.1f} s beside 64 "
                          "trickling clients")
        check(took < 10 * MULT, f"a scrape waited {took:.1f} s")
        check(refused == 4, f"{refused} of 12 connections from one address "
                            "refused at once, not 4 (8 allowed)")


def storm_scrapes(host, port, sources, token, scraper="127.0.3.1"):
    """Clients from `sources` (an address, or (address, n) for several of
    one) each holding a connection without the token, sending a request's
    headers slowly, and reconnecting as soon as it is ended; with all of
    them held, 10 scrapes with `token` from `scraper`, one after another:
    (their statuses, connections the clients opened)."""
    import select
    import socket
    import threading
    stop = threading.Event()
    held = {}     # source -> its connection
    opened = [0]

    def hold(src):
        addr = src[0] if isinstance(src, tuple) else src
        try:
            c = socket.create_connection((host, port), timeout=2,
                                         source_address=(addr, 0))
            c.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
            c.setblocking(False)
            held[src] = c
            opened[0] += 1
        except OSError:
            held.pop(src, None)

    def storm():
        while not stop.is_set():
            for src in sources:
                if src not in held:
                    hold(src)
            conns = list(held.items())
            ready, _, _ = select.select([c for _, c in conns], [], [], 0.02)
            for src, c in conns:
                if c in ready:
                    try:
                        gone = c.recv(64) == b""
                    except OSError:
                        gone = True
                    if gone:
                        c.close()
                        held.pop(src, None)
    t = threading.Thread(target=storm, daemon=True)
    t.start()
    try:
        answers = []
        for _ in range(10):
            # Every place taken (again: a scrape's victim reconnects).
            wait_for("every client's connection held",
                     lambda: len(held) == len(sources), timeout=20)
            answers.append(scrape_from(host, port, scraper, 5 * MULT,
                                       token=token))
    finally:
        stop.set()
        t.join(timeout=10)
        for c in list(held.values()):
            c.close()
    return answers, opened[0]


def test_a_token_holder_gets_in_when_others_hold_every_place():
    """Clients from many addresses (8 each) that reconnect as soon as they
    are ended keep the 64 connections nearly full, and a scraper comes in
    only when it wins a race with them. With [metrics] token_file set, a
    scrape must send the token (Authorization: Bearer; 401 without it),
    and where every place is taken the oldest connection that has not
    shown it makes room for the new one (one of its own address's where
    that address holds its 8). 64 clients that never show it, each
    reconnecting at once, from 64 addresses: 10 scrapes with the token in
    a row are each answered 200 at the first try (none without the
    token's rule). 56 from addresses of their own and 8 from the
    scraper's: at least 5 of 10 (all, on a quick server; none before)."""
    token = "memtally-metrics-test-token-0123456789"
    d = tempfile.mkdtemp(prefix="mt-it-tok-")
    tok = os.path.join(d, "token")
    with open(tok, "w") as f:
        f.write(token + "\n")
    os.chmod(tok, 0o600)
    conf = config_file(f"[metrics]\ntoken_file = {tok}\n")
    with Server("--config", conf, "--metrics", "127.0.0.1:0") as s:
        url = wait_for("metrics listening log line", lambda: metrics_url(s))
        host, port = url.split("/")[2].rsplit(":", 1)
        port = int(port)
        st, hdr, _ = get(url)
        check(st == 401 and "Bearer" in hdr.get("WWW-Authenticate", ""),
              f"no token: {st} {hdr}")
        check(scrape_from(host, port, "127.0.3.9", 5 * MULT,
                          token="x" * len(token)) == 401,
              "a wrong token was not refused")
        check(scrape_from(host, port, "127.0.3.9", 5 * MULT,
                          token=token) == 200, "the token was refused")

        others = [f"127.0.1.{10 + i}" for i in range(64)]
        far, far_opened = storm_scrapes(host, port, others, token)
        # 56 others, and 8 beside the scraper (its host, its NAT, its /64).
        near = others[:56] + [("127.0.3.1", k) for k in range(8)]
        close, close_opened = storm_scrapes(host, port, near, token)

        req = urllib.request.Request(
            url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10 * MULT) as resp:
            m = parse(resp.read().decode())
        ended = {k[1][0][1]: int(v) for k, v in m.items()
                 if k[0] == "memtally_metrics_connections_ended_total"}
        print(f"  64 clients without the token, reconnecting at once, from "
              f"64 addresses ({far_opened} connections): 10 scrapes with "
              f"it got {far}; 8 of them from the scraper's address "
              f"({close_opened} connections): {close}; connections ended: "
              f"{ended}", flush=True)
        check(far == [200] * 10, f"scrapes with the token: {far}")
        # Clients on the scraper's own address that reconnect at once can
        # cascade through its 8 places, each reconnect closing the oldest,
        # and reach the scraper's connection before the server has read
        # its token: 2 of 10 once with AddressSanitizer slowing the server.
        check(close.count(200) >= 5 and set(close) <= {200, None},
              f"scrapes with the token beside its address's clients: "
              f"{close}")
        # Room was made: where a client had not yet refilled a place the
        # header deadline freed (a loaded machine), a scrape needed none.
        check(ended.get("made_room", 0) >= 1,
              f"no connection was closed to make room: {ended}")
        check("oldest connection without the token closed" in s.logtext(),
              "no log line for the connections closed to make room")


# In the network namespace: 8 connections to 127.0.0.1:PORT from
# 127.0.6.1, each asking for 30 answers at once and reading 1300 bytes
# every 2 s (enough that libmicrohttpd's idle timeout never fires); a 9th
# from that address at once, then one every 0.2 s until it is answered.
# Prints "FIRST TOOK READ_MIN": the 9th's first status (None: refused),
# when one was answered (None: not in 45 s) and the least a reader read.
SLOW_READERS = r"""
import socket, sys, time
sys.path.insert(0, sys.argv[2])
from test_metrics import scrape_from
port, src = int(sys.argv[1]), "127.0.6.1"
readers = []
for _ in range(8):
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    c.bind((src, 0))
    c.settimeout(5)
    c.connect(("127.0.0.1", port))
    c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 30)
    c.setblocking(False)
    readers.append(c)
t0 = time.monotonic()
got = [0] * 8
next_read = t0
first = scrape_from("127.0.0.1", port, src, 2)
took = None
while time.monotonic() - t0 < float(sys.argv[3]):
    if time.monotonic() >= next_read:
        for i, c in enumerate(readers):
            try:
                got[i] += len(c.recv(1300))
            except OSError:
                pass
        next_read += 2.0
    if scrape_from("127.0.0.1", port, src, 2) == 200:
        took = time.monotonic() - t0
        break
    time.sleep(0.2)
print(first, took and round(took, 1), min(got), flush=True)
"""


def test_slow_readers_are_ended():
    """A client that reads its answer a few bytes at a time (an answer
    larger than the socket buffers hold, as per-process series make it)
    kept its connection for as long as it kept reading, since each read
    resets libmicrohttpd's idle timeout: an address's 8 connections held
    for ever. An answer must be read 15 s after its request. In a network
    namespace whose sockets buffer little (a 1280-byte MTU, 4 KiB send
    buffers: what a large answer meets on any network), 8 such readers of
    one address hold its places, so a 9th from it is refused; once the
    server ends them it is answered. The answer is made large as it is in
    use: per-process series of 8 workers in groups of their own (~26 KB,
    40 s at the readers' pace)."""
    small = [["ip", "link", "set", "lo", "mtu", "1280"],
             ["sysctl", "-qw", "net.ipv4.tcp_wmem=4096 4096 4096"]]
    with Namespace("mts", small, "make its buffers small") as inns:
        conf = config_file("[metrics]\nper_process = true\n")
        with Server("--config", conf, "--metrics", "127.0.0.1:0",
                    prefix=inns) as s:
            url = wait_for("metrics listening log line",
                           lambda: metrics_url(s))
            port = url.split("/")[2].rsplit(":", 1)[1]
            ws = [Worker([*worker("hold"), "1"], s.env(group=f"slow{i}"))
                  for i in range(8)]
            try:
                wait_for("8 workers counted", lambda: len(s.ps()) == 8)
                r = subprocess.run(inns + [sys.executable, "-c",
                                           SLOW_READERS, port, HERE,
                                           str(45 * MULT)],
                                   capture_output=True, text=True,
                                   timeout=120 * MULT)
            finally:
                for w in ws:
                    w.close()
            check(r.returncode == 0, f"the clients: {r.stderr}")
            first, took, read = r.stdout.split()
            print(f"  8 slow readers of one address: a 9th first got "
                  f"{first}, one was answered after {took} s; each reader "
                  f"read at least {read} bytes", flush=True)
            check(first == "None", f"a 9th connection from the address "
                                   f"was answered {first} beside 8 of its "
                                   "own")
            check(int(read) >= 2600, f"a reader read only {read} bytes: "
                                     "the server was not sending")
            check(took != "None", "the 8 slow readers held their "
                                  f"address's places for {45 * MULT} s")
            check(float(took) >= 13.5, f"answered after {took} s, before "
                                       "the 15 s an answer has")
            logs = s.logtext()
            check("answer not read in time" in logs,
                  "no log line for the slow readers ended")
            check("connection from 127.0.6.1:" in logs and
                  "refused: 8 open from its address" in logs,
                  "no log line for the 9th connection refused")


# In the network namespace: 12 connections to [HOST]:PORT, each from an
# address of its own in one IPv6 /64; how many were refused at accept.
SAME_64 = r"""
import socket, sys
sys.path.insert(0, sys.argv[3])
from harness import Ends
ends = Ends()
for i in range(12):
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5,
                                 source_address=(f"fd00:6d74::{i + 2:x}", 0))
    c.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
    ends.add(c)
ends.wait(15)
print(ends.refused_at_accept(8, 5.0), flush=True)
"""


def test_one_ipv6_host_gets_eight_connections():
    """libmicrohttpd's own per-address limit counts each IPv6 address, and
    a host has a /64 of them to connect from: one host could take every
    connection and keep Prometheus out for as long as it kept trying. A
    /64 counts as one address. In a network namespace of its own (so the
    host's addresses are not touched): 12 connections from 12 addresses
    of one /64, 4 refused at once."""
    addrs = [["ip", "-6", "addr", "add", f"fd00:6d74::{i:x}/64", "dev", "lo",
              "nodad"] for i in range(1, 14)]
    with Namespace("mtm", addrs, "give the namespace IPv6 addresses") as inns:
        with Server("--metrics", "[fd00:6d74::1]:0", prefix=inns) as s:
            url = wait_for("metrics listening log line",
                           lambda: metrics_url(s))
            host, port = url.split("/")[2].rsplit(":", 1)
            r = subprocess.run(inns + [sys.executable, "-c", SAME_64,
                                       host.strip("[]"), port, HERE],
                               capture_output=True, text=True,
                               timeout=60 * MULT)
            check(r.returncode == 0, f"the clients: {r.stderr}")
            refused = int(r.stdout.strip())
            print(f"  12 connections from one /64: {refused} refused at "
                  "once", flush=True)
            check(refused == 4, f"{refused} of 12 connections from one "
                                "IPv6 /64 refused at once, not 4 (8 allowed)")


if __name__ == "__main__":
    run([test_live_worker, test_http_surface, test_bad_address_refused,
         test_malformed_requests_do_not_flood_the_log,
         test_slow_clients_do_not_lock_out_a_scraper,
         test_slow_readers_are_ended,
         test_a_token_holder_gets_in_when_others_hold_every_place,
         test_one_ipv6_host_gets_eight_connections])
