"""The Python package installed by pip, as a Celery or Dask user would:
`pip install --no-build-isolation --no-index ./python` into a fresh venv
(with the system's site packages, for Debian's python3-protobuf; offline),
from a copy of the checkout's python/ and proto/ (the build writes into the
directory it builds from; the source tree stays untouched). The installed
package carries its generated protobuf module, imports with its Celery and
Dask integrations, and talks to a running memtallyd with nothing set.
Environment: as for the integration tests, and MEMTALLY_SOURCE_DIR.
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from harness import MULT, Server, Skip, check, run

SRC = os.environ["MEMTALLY_SOURCE_DIR"]

PROBE = r"""
import importlib.util, json, os, sys
import memtally
from memtally import Client
out = {"file": memtally.__file__, "pb": memtally.pb.__file__}
for eng, mod in (("celery", "memtally.celery"), ("distributed", "memtally.dask")):
    if importlib.util.find_spec(eng) is not None:
        __import__(mod)
        out[mod] = sys.modules[mod].__file__
with Client(sys.argv[1]) as c:
    u = c.usage()
    r = c.admit(1 << 20, group="pip", task="t1")
    out["limit"] = u.fleet_limit
    out["admitted"] = r.admitted
    out["reserved"] = c.usage().reserved_bytes
    out["released"] = c.release(r.reservation).bytes
print(json.dumps(out))
"""


def sh(argv, **kw):
    p = subprocess.run(argv, capture_output=True, text=True,
                       timeout=180 * MULT, **kw)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}:\n"
                             f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def test_pip_install_into_venv():
    for mod, pkg in (("ensurepip", "python3-venv"), ("pip", "python3-pip"),
                     ("setuptools", "python3-setuptools"),
                     ("wheel", "python3-wheel"),
                     ("google.protobuf", "python3-protobuf")):
        # Looked for, not imported (setuptools must not be imported here
        # after distutils).
        if importlib.util.find_spec(mod) is None:
            raise Skip(f"{pkg} not installed for {sys.executable}")
    if not shutil.which("protoc"):
        raise Skip("protoc not installed (apt-get install protobuf-compiler)")
    with open(os.path.join(SRC, "CMakeLists.txt")) as f:
        version = re.search(r"project\(memtally\s+VERSION\s+([0-9.]+)",
                            f.read()).group(1)

    tmp = tempfile.mkdtemp(prefix="mt-pip-")
    co = os.path.join(tmp, "checkout")
    os.mkdir(co)
    shutil.copytree(os.path.join(SRC, "python"), os.path.join(co, "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                  "__pycache__"))
    shutil.copytree(os.path.join(SRC, "proto"), os.path.join(co, "proto"))
    shutil.copy(os.path.join(SRC, "CMakeLists.txt"), co)
    venv = os.path.join(tmp, "venv")
    py = os.path.join(venv, "bin", "python")
    # Nothing from the build tree or the source tree: only what pip put in
    # the venv (and the system's site packages) can be imported.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MEMTALLY_PB2_DIR", "MEMTALLY_SOCKET",
                        "LD_PRELOAD", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    sh([sys.executable, "-m", "venv", "--system-site-packages", venv], env=env)
    sh([py, "-m", "pip", "install", "--no-build-isolation", "--no-index",
        "--no-cache-dir", os.path.join(co, "python")], env=env, cwd=tmp)
    site = sh([py, "-c", "import sysconfig; print(sysconfig.get_paths()"
               "['purelib'])"], env=env, cwd=tmp).strip()
    pkg = os.path.join(site, "memtally")
    check(os.path.exists(os.path.join(pkg, "memtally_pb2.py")),
          f"no memtally_pb2.py in {pkg}: {os.listdir(pkg)}")
    show = sh([py, "-m", "pip", "show", "memtally"], env=env, cwd=tmp)
    check(f"Version: {version}" in show, f"pip show: {show}")

    with Server("--fleet-limit", "64MiB") as s:
        out = json.loads(sh([py, "-c", PROBE, s.socket], env=env, cwd=tmp))
        check(out["file"] == os.path.join(pkg, "__init__.py")
              and out["pb"] == os.path.join(pkg, "memtally_pb2.py"),
              f"not the installed package: {out}")
        for eng, mod in (("celery", "memtally.celery"),
                         ("distributed", "memtally.dask")):
            if importlib.util.find_spec(eng) is None:
                continue        # that integration's engine is not installed
            check(out.get(mod, "").startswith(pkg), f"{mod}: {out}")
        check(out["limit"] == 64 << 20 and out["admitted"]
              and out["reserved"] == 1 << 20 and out["released"] == 1 << 20,
              f"memtallyd's answers: {out}")
        # The command, from the installed package.
        text = sh([py, "-m", "memtally", "--socket", s.socket, "usage"],
                  env=env, cwd=tmp)
        check("limit 64.0 MiB" in text, f"python3 -m memtally usage: {text}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run([test_pip_install_into_venv])
