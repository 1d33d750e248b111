"""The node on cgroup v2, on Debian 12's own kernel: the tests that put
memtallyd in a memory cgroup (test_guard, test_packing, test_node_oom's
daemon test), run again inside a virtual machine whose only cgroup
hierarchy is v2, with vm_overcommit (strict overcommit, a setting of the
whole machine: the VM's own there).

A machine with the v1 memory controller (this project's CI runs on one)
makes every node a v1 cgroup, and memtallyd's v2 reads (memory.current,
memory.max, memory.stat's v2 keys) and the tests' (memory.events) would
meet only a fake procfs. So this boots the kernel of Debian 12's
linux-image-amd64 (unpacked by scripts/deps.sh, with the eleven modules a
9p root under an overlay needs) under qemu, with no KVM needed (software
emulation), 4 GiB and two vCPUs, and an initramfs of busybox that:

- mounts this machine's root read-only over 9p (the same paths, binaries
  and Python) under a tmpfs (overlayfs: the tests write where they always
  do, and nothing reaches this machine's files), and cgroup2 alone at
  /sys/fs/cgroup, with the memory controller;
- runs each test file there, as root, and prints its exit status;
- powers the machine off.

Each inner test must pass (0): a skip inside (77) is a failure here, since
what this test exists for is the one thing the VM provides. Time
multiplier inside: 4 times this one's (software emulation).

MEMTALLY_VM_TESTS runs other files there instead, separated by ";", each
optionally followed by the names of its tests to run:
`MEMTALLY_VM_TESTS="test_mapped;test_trust test_lies_hurt_only_the_liar"`.

Skipped (77) with the reason when qemu, a static busybox or the kernel is
missing (scripts/deps.sh installs them), or not root.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import MULT, Skip, check, run  # noqa: E402

# The distribution's interpreter, as ctest runs the tests (its packages:
# python3-protobuf); else this one.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") \
    else sys.executable
# Where scripts/deps.sh puts the kernel: vmlinuz and modules/*.ko.
KERNEL_DIR = os.environ.get("MEMTALLY_VM_KERNEL",
                            "/var/cache/memtally/vm-kernel")
# In the order they load: each needs only those before it.
MODULES = ("virtio_ring", "virtio", "virtio_pci_legacy_dev",
           "virtio_pci_modern_dev", "virtio_pci", "netfs", "fscache",
           "9pnet", "9pnet_virtio", "9p", "overlay")
# What runs inside: each file whole, or the tests named after it.
# test_node_oom's other test first runs the fleet with no policy and needs
# it to meet the OOM killer, a race that software emulation's pace does not
# always run the same way; its point (memtally keeps the node alive) is
# test_packing's and test_guard's here.
INNER = ("test_guard", "test_packing",
         "test_node_oom test_daemon_survives_node_oom",
         # strict overcommit: a machine-wide setting, safe to flip in here
         "vm_overcommit")
# Another list, by hand ("test_mapped;test_sparse test_x"): any test file
# of this directory on Debian 12's kernel and cgroup v2.
if os.environ.get("MEMTALLY_VM_TESTS"):
    INNER = tuple(t.strip() for t in
                  os.environ["MEMTALLY_VM_TESTS"].split(";") if t.strip())

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
ip link set lo up  # loopback: the tests' TCP and HTTP peers
for m in %(modules)s; do
  insmod /mod/$m.ko || { echo "@@ setup insmod $m failed"; poweroff -f; }
done
mkdir -p /lower /rw /root
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 \
  host /lower || { echo "@@ setup 9p mount failed"; poweroff -f; }
mount -t tmpfs -o size=70%% rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work \
  root /root || { echo "@@ setup overlay mount failed"; poweroff -f; }
mount -t proc proc /root/proc
mount -t sysfs sys /root/sys
mount -t devtmpfs dev /root/dev
mkdir -p /root/dev/shm /root/dev/pts
mount -t tmpfs shm /root/dev/shm
mount -t tmpfs run /root/run
mount -t cgroup2 cgroup2 /root/sys/fs/cgroup || {
  echo "@@ setup cgroup2 mount failed"; poweroff -f; }
echo "@@ controllers $(cat /root/sys/fs/cgroup/cgroup.controllers)"
chroot /root /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 %(env)s /bin/sh -c '
echo "@@ cgroups $(cat /proc/self/cgroup | tr "\n" " ")"
cd %(cwd)s
while read -r t args; do
  echo "@@ start $t"
  %(python)s %(here)s/$t.py $args </dev/null
  echo "@@ rc $t $?"
done <<EOF
%(tests)s
EOF'
echo "@@ done"
poweroff -f
"""


def static(path):
    """True if the ELF at `path` asks for no interpreter (links nothing)."""
    try:
        out = subprocess.run(["readelf", "-l", path], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Program Headers" in out and "INTERP" not in out


def tools():
    """(qemu, busybox, vmlinuz) or Skip with what is missing."""
    if os.geteuid() != 0:
        raise Skip("needs root (the tests inside make cgroups as root, and "
                   "qemu must read the whole root to share it)")
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        raise Skip("no qemu-system-x86_64 (package qemu-system-x86; "
                   "scripts/deps.sh installs it)")
    busybox = "/bin/busybox"
    if not static(busybox):
        raise Skip("no static /bin/busybox (package busybox-static; "
                   "scripts/deps.sh installs it)")
    vmlinuz = os.path.join(KERNEL_DIR, "vmlinuz")
    missing = [m for m in MODULES if not os.path.exists(
        os.path.join(KERNEL_DIR, "modules", m + ".ko"))]
    if not os.path.exists(vmlinuz) or missing:
        raise Skip("no kernel for the VM in %s (%s; scripts/deps.sh fetches "
                   "Debian's linux-image-amd64 there)" % (
                       KERNEL_DIR, "modules " + " ".join(missing) if missing
                       else "no vmlinuz"))
    if os.uname().machine != "x86_64":
        raise Skip("the VM is x86_64 and this machine is %s" %
                   os.uname().machine)
    return qemu, busybox, vmlinuz


def initramfs(d, busybox, tests):
    """Write the initramfs (busybox, the modules, /init) to d/initrd.cpio."""
    root = os.path.join(d, "root")
    for sub in ("bin", "proc", "sys", "dev", "mod", "tmp"):
        os.makedirs(os.path.join(root, sub))
    shutil.copy(busybox, os.path.join(root, "bin", "busybox"))
    for m in MODULES:
        shutil.copy(os.path.join(KERNEL_DIR, "modules", m + ".ko"),
                    os.path.join(root, "mod"))
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("MEMTALLY", "MT_", "PYTHONDONTWRITE"))}
    env["MEMTALLY_TEST_TIMEOUT_MULT"] = "%g" % (4 * MULT)
    env["PYTHONUNBUFFERED"] = "1"
    env["MEMTALLY_IN_VM"] = "1"
    init = INIT % dict(
        modules=" ".join(MODULES),
        env=" ".join("%s='%s'" % (k, v) for k, v in sorted(env.items())),
        cwd=os.getcwd(), here=HERE, python=PYTHON,
        tests="\n".join(tests))
    with open(os.path.join(root, "init"), "w") as f:
        f.write(init)
    os.chmod(os.path.join(root, "init"), 0o755)
    names = subprocess.run(["find", "."], cwd=root, capture_output=True,
                           check=True).stdout
    out = os.path.join(d, "initrd.cpio")
    with open(out, "wb") as f:
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root,
                       input=names, stdout=f, check=True)
    return out


def boot(tests, timeout):
    """Boot the VM on `tests`; {test: exit status}, and what it printed."""
    qemu, busybox, vmlinuz = tools()
    d = tempfile.mkdtemp(prefix="mt-vm-")
    try:
        rd = initramfs(d, busybox, tests)
        argv = [qemu, "-m", "4096", "-smp", "2", "-nographic", "-no-reboot",
                "-kernel", vmlinuz, "-initrd", rd,
                "-virtfs", "local,path=/,mount_tag=host,security_model=none,"
                "readonly=on,multidevs=remap",
                "-append", "console=ttyS0 quiet panic=-1 "
                "systemd.unified_cgroup_hierarchy=1"]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        rcs, text, end = {}, [], time.monotonic() + timeout
        try:
            for raw in p.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                line = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1bc", "", line)
                text.append(line)
                print(line, flush=True)
                m = re.match(r"@@ rc (\S+) (\d+)", line)
                if m:
                    rcs[m.group(1)] = int(m.group(2))
                if time.monotonic() > end:
                    break
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
        return rcs, "\n".join(text)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_cgroup_v2_node():
    t0 = time.monotonic()
    rcs, text = boot(INNER, 1500 * MULT)
    check("@@ setup" not in text,
          "the VM did not set up: %s" % [ln for ln in text.splitlines()
                                          if ln.startswith("@@ setup")])
    ctrl = re.search(r"@@ controllers (.*)", text)
    check(ctrl and "memory" in ctrl.group(1).split(),
          "no memory controller in the VM's cgroup2 root: %r" % (
              ctrl and ctrl.group(1)))
    cgs = re.search(r"@@ cgroups (.*)", text)
    check(cgs and cgs.group(1).split() == ["0::/"],
          "the VM's tests are not in a cgroup v2 hierarchy alone: %r" % (
              cgs and cgs.group(1)))
    for t in (i.split()[0] for i in INNER):
        check(t in rcs, "%s did not end in the VM (%.0f s)" % (
            t, time.monotonic() - t0))
        check(rcs[t] == 0, "%s exited %d in the VM (77: skipped, which it "
              "must not be there)" % (t, rcs[t]))
    print("  %d test files passed on cgroup v2 in %.0f s" % (
        len(INNER), time.monotonic() - t0), flush=True)


if __name__ == "__main__":
    run([test_cgroup_v2_node])
