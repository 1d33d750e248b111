"""deploy/prometheus/: the rules pass `promtool check rules` and their unit
tests (`promtool test rules`); the scrape config passes `promtool check
config`; and a real Prometheus server, run with that scrape config (its
file_sd targets and relabelling) and those rules, scrapes two memtallyd
("nodes") and records a cluster total equal to the two nodes' sum, for the
fleet and for a group both nodes share.
Environment: as for the integration tests, and MEMTALLY_SOURCE_DIR.
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
import urllib.request

from harness import MIB, MULT, Server, Skip, Worker, check, run, wait_for, worker

SRC = os.environ["MEMTALLY_SOURCE_DIR"]
PROM = os.path.join(SRC, "deploy", "prometheus")
RULES = [os.path.join(PROM, f) for f in ("memtally.rules.yml",
                                         "memtally.alerts.yml")]


def need(tool):
    path = shutil.which(tool)
    if not path:
        raise Skip(f"{tool} is not installed (apt-get install prometheus)")
    return path


def promtool(*args):
    r = subprocess.run([need("promtool"), *args], capture_output=True,
                       text=True, timeout=60 * MULT, cwd=PROM)
    check(r.returncode == 0, f"promtool {' '.join(args)}: {r.returncode}\n"
          f"{r.stdout}{r.stderr}")
    return r.stdout


def test_promtool_check_and_unit_tests():
    out = promtool("check", "rules", *RULES)
    check(out.count("SUCCESS") == 2, f"check rules: {out}")
    out = promtool("test", "rules", "memtally.test.yml")
    check("SUCCESS" in out, f"test rules: {out}")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metrics_addr(s):
    import re
    found = re.findall(r'msg="metrics listening" addr=(\S+)', s.logtext())
    return found[-1] if found else None


def scrape_config(tmp, targets):
    """The shipped prometheus.yml with its file_sd pointed at our targets
    file, rule files by absolute path and 1 s intervals; everything else
    (relabelling, metric drops) as shipped."""
    import yaml
    with open(os.path.join(PROM, "prometheus.yml")) as f:
        cfg = yaml.safe_load(f)
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    cfg["rule_files"] = RULES
    (job,) = cfg["scrape_configs"]
    check(job["job_name"] == "memtally", f"job {job['job_name']}")
    job["scrape_interval"] = "1s"
    job["scrape_timeout"] = "1s"
    tdir = os.path.join(tmp, "memtally-targets")
    os.mkdir(tdir)
    with open(os.path.join(tdir, "nodes.yml"), "w") as f:
        yaml.safe_dump(targets, f)
    job["file_sd_configs"][0]["files"] = [os.path.join(tdir, "*.yml")]
    job["file_sd_configs"][0]["refresh_interval"] = "1s"
    path = os.path.join(tmp, "prometheus.yml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def settle(what, fn, timeout=30):
    """Poll fn() -> (ok, detail) until ok; fail with the last detail."""
    box = {}

    def pred():
        ok, box["detail"] = fn()
        return ok
    try:
        wait_for(what, pred, timeout=timeout, interval=0.5)
    except AssertionError:
        raise AssertionError(f"{what}: {box.get('detail')}") from None


def query(base, expr):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    check(body["status"] == "success", f"{expr}: {body}")
    return {tuple(sorted(s["metric"].items())): float(s["value"][1])
            for s in body["data"]["result"]}


def test_prometheus_records_cluster_total():
    need("prometheus")
    import importlib.util
    if importlib.util.find_spec("yaml") is None:
        raise Skip("python3-yaml is not installed (apt-get install python3-yaml)")
    tmp = tempfile.mkdtemp(prefix="mt-prom-")
    with Server("--metrics", "127.0.0.1:0") as a, \
            Server("--metrics", "127.0.0.1:0") as b:
        # Node A: 24 MiB in etl + 8 MiB in web; node B: 40 MiB in etl.
        ws = [Worker([*worker("hold"), str(n)], s.env(group=g))
              for s, n, g in ((a, 24, "etl"), (a, 8, "web"), (b, 40, "etl"))]
        for w in ws:
            check(w.readline().startswith("ready"), "worker not ready")
        wait_for("node A counts 32 MiB",
                 lambda: a.status()["fleet"]["bytes"] >= 32 * MIB)
        wait_for("node B counts 40 MiB",
                 lambda: b.status()["fleet"]["bytes"] >= 40 * MIB)
        pa = metrics_addr(a).rsplit(":", 1)[1]
        pb = metrics_addr(b).rsplit(":", 1)[1]
        # A names its node in the targets file; B gets the host part of
        # its address from the shipped relabelling.
        cfg = scrape_config(tmp, [
            {"targets": [f"127.0.0.1:{pa}"], "labels": {"node": "node-a"}},
            {"targets": [f"localhost:{pb}"]}])
        promtool("check", "config", cfg)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = open(os.path.join(tmp, "prometheus.log"), "w+")
        prom = subprocess.Popen(
            [need("prometheus"), f"--config.file={cfg}",
             f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            def nodes_up():
                if prom.poll() is not None:
                    log.seek(0)
                    raise AssertionError("prometheus exited: " + log.read())
                up = query(base, 'up{job="memtally"}')
                return len(up) == 2 and all(v == 1 for v in up.values()) and up
            up = wait_for("both memtallyd scraped", nodes_up, timeout=60,
                          interval=0.5)
            nodes = sorted(dict(k)["node"] for k in up)
            check(nodes == ["localhost", "node-a"], f"node labels {nodes}")

            # The figures Prometheus holds are the nodes' own (polled: a
            # scrape or a rule evaluation may lag a node by a second).
            def fleets():
                return a.status()["fleet"]["bytes"], b.status()["fleet"]["bytes"]

            def scraped_match():
                fa, fb = fleets()
                r = query(base, "memtally_fleet_accounted_bytes")
                got = {dict(k)["node"]: v for k, v in r.items()}
                return got == {"node-a": fa, "localhost": fb}, (got, fa, fb)
            settle("scraped fleet figures = the nodes' own", scraped_match)

            def total_match():
                fa, fb = fleets()
                r = query(base, "job:memtally_fleet_accounted_bytes:sum")
                want = {(("__name__", "job:memtally_fleet_accounted_bytes:sum"),
                         ("job", "memtally")): float(fa + fb)}
                return r == want and fa + fb >= 72 * MIB, (r, fa, fb)
            settle("recorded cluster total = node A + node B", total_match)

            def groups_match():
                ga = {g["name"]: g["bytes"] for g in a.status()["groups"]}
                gb = {g["name"]: g["bytes"] for g in b.status()["groups"]}
                r = query(base, "job_group:memtally_group_accounted_bytes:sum")
                got = {dict(k)["group"]: v for k, v in r.items()}
                want = {"etl": ga["etl"] + gb["etl"], "web": ga["web"]}
                return got == want, (got, ga, gb)
            settle("recorded group totals = node A + node B", groups_match)
            # The per-process series are dropped at the scrape.
            check(query(base, "memtally_process_accounted_bytes") == {},
                  "per-process series kept")
            # And the node going away is what MemtallyNodeStale watches.
            b.stop()
            wait_for("node B down", lambda: query(
                base, 'up{node="localhost"} == 0'), timeout=30, interval=0.5)
        finally:
            prom.terminate()
            try:
                prom.wait(timeout=20 * MULT)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
            for w in ws:
                w.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run([test_promtool_check_and_unit_tests,
         test_prometheus_records_cluster_total])
