"""deploy/kubernetes/memtally.yaml parses and holds together: memtallyd
beside the worker, sharing the process namespace and the socket directory
(the only thing that must be shared: workers get their shared memory as
descriptors over the socket, so nothing is mounted at /dev/shm for it); the
worker preloads the library from a shared volume and names the socket
memtallyd listens on; the ConfigMap's memtallyd.conf is accepted by the
built memtallyd.
usage: test_kubernetes.py SOURCE_DIR MEMTALLYD
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    print("SKIPPED: python3-yaml is not installed (apt-get install python3-yaml)")
    sys.exit(77)

src, memtallyd = sys.argv[1], sys.argv[2]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL", msg)


with open(os.path.join(src, "deploy/kubernetes/memtally.yaml")) as f:
    docs = [d for d in yaml.safe_load_all(f) if d]
kinds = {d["kind"]: d for d in docs}
check(set(kinds) >= {"ConfigMap", "Deployment"}, f"kinds: {sorted(kinds)}")
for d in docs:
    check(d.get("apiVersion") and d.get("metadata", {}).get("name"),
          f"{d.get('kind')}: apiVersion and metadata.name")

dep = kinds["Deployment"]
tmpl = dep["spec"]["template"]
check(dep["spec"]["selector"]["matchLabels"].items()
      <= tmpl["metadata"]["labels"].items(), "selector matches the template")
pod = tmpl["spec"]
check(pod.get("shareProcessNamespace") is True or pod.get("hostPID") is True,
      "memtallyd must see the workers' pids (shareProcessNamespace/hostPID)")
vols = {v["name"]: v for v in pod["volumes"]}
everyone = pod.get("initContainers", []) + pod["containers"]
by_name = {c["name"]: c for c in everyone}
for c in everyone:
    check(c.get("image") and c.get("command"), f"{c['name']}: image, command")
    for m in c.get("volumeMounts", []):
        check(m["name"] in vols, f"{c['name']}: mount of unknown {m['name']}")


def mounts(c):
    return {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}


def volume_at(c, path):
    """The volume that holds `path` in container c (longest mount prefix)."""
    best = None
    for mp, name in mounts(c).items():
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) > len(best[0]):
                best = (mp, name)
    return best[1] if best else None


servers = [c for c in everyone if any("memtallyd" in a for a in c["command"])]
check(len(servers) == 1, "one memtallyd container")
srv = servers[0]
if srv in pod.get("initContainers", []):
    check(srv.get("restartPolicy") == "Always",
          "memtallyd as an init container must be a native sidecar")
workers = [c for c in pod["containers"] if c is not srv]
check(workers, "at least one worker container")

cfg_name = volume_at(srv, "/etc/memtally/memtallyd.conf")
check(cfg_name and vols[cfg_name].get("configMap", {}).get("name")
      == kinds["ConfigMap"]["metadata"]["name"], "config from the ConfigMap")
conf = kinds["ConfigMap"]["data"]["memtallyd.conf"]
sock = next(line.split("=", 1)[1].strip() for line in conf.splitlines()
            if line.strip().startswith("socket"))

for c in (srv, *workers):
    check("/dev/shm" not in mounts(c),
          f"{c['name']}: mounts /dev/shm, which memtally no longer uses")
run_vol = volume_at(srv, sock)
check(run_vol is not None, f"memtallyd's socket {sock} is on a volume")
for w in workers:
    env = {e["name"]: e.get("value") for e in w.get("env", [])}
    check(env.get("MEMTALLY_SOCKET") == sock,
          f"{w['name']}: MEMTALLY_SOCKET={env.get('MEMTALLY_SOCKET')} != {sock}")
    check(volume_at(w, sock) == run_vol, f"{w['name']}: shares the socket dir")
    pre = env.get("LD_PRELOAD", "")
    check(pre.endswith("libmemtally_preload.so"), f"{w['name']}: LD_PRELOAD")
    lib_vol = volume_at(w, pre)
    if lib_vol:  # preload from a shared volume: something must fill it
        fillers = [c for c in pod.get("initContainers", [])
                   if volume_at(c, pre) == lib_vol and c is not srv]
        check(fillers and any("libmemtally_preload.so" in " ".join(c["command"])
                              for c in fillers),
              f"{w['name']}: an init container copies the preload library")

# A sidecar's guard would guard its own container's cgroup, not the pod's.
guard = conf.split("[guard]", 1)[1].split("\n[", 1)[0] if "[guard]" in conf \
    else ""
check(srv in pod.get("initContainers", []) and "hostPID" not in pod and
      "enabled = false" in guard or "hostPID" in pod,
      "a sidecar memtallyd sees its own container's cgroup only: "
      "[guard] enabled = false")

# The socket's directory as kubelet makes an emptyDir (0777, 2777 with
# fsGroup, owned by root), then as the init containers leave it: memtallyd
# refuses a directory others may write unless it is sticky.
run_mount = next(mp for mp, name in mounts(srv).items() if name == run_vol)
mode = 0o2777 if pod.get("securityContext", {}).get("fsGroup") else 0o777
for c in pod.get("initContainers", []):
    cmd = c.get("command", [])
    if c is not srv and cmd[:1] == ["chmod"] and volume_at(c, cmd[-1]) == \
            run_vol:
        mode = int(cmd[1], 8)

# The ConfigMap's config must be one memtallyd accepts, its socket in
# that directory.
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "memtallyd.conf")
    with open(path, "w") as f:
        f.write(conf)
    rundir = os.path.join(tmp, "run")
    os.mkdir(rundir)
    os.chmod(rundir, mode)
    s = os.path.join(rundir, os.path.relpath(sock, run_mount))
    p = subprocess.Popen([memtallyd, "--config", path, "--socket", s,
                          "--segment", f"mt-k8s-{os.getpid()}"],
                         stderr=subprocess.PIPE)
    # Generous: a sanitized memtallyd beside two sanitized test passes on
    # two cores can take seconds to start and to stop.
    end = time.monotonic() + 45
    while not os.path.exists(s) and p.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    started = os.path.exists(s)
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        err = p.communicate(timeout=45)[1].decode()
    except subprocess.TimeoutExpired:
        p.kill()
        err = "(did not stop 45 s after SIGTERM) " + p.communicate()[1].decode()
    check(started and p.returncode == 0,
          f"memtallyd with the ConfigMap's config: started={started} "
          f"exit {p.returncode}: {err[-3000:]}")

print(f"{1 if not failures else 0} passed, {1 if failures else 0} failed")
sys.exit(1 if failures else 0)
