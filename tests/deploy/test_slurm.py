"""deploy/slurm/ with a real Slurm: munged, slurmctld and slurmd from
Debian's packages, started by the test on this machine (the local short
host name as the one node, proctrack/linuxproc, task/none, private ports,
state directories and munge socket), and a memtallyd whose [hooks] run
memtally-slurm-hook.

- A node memtally drained before memtallyd was restarted is resumed by
  the fleet's hook at start (MEMTALLY_PREVIOUS=unknown).
- A group over its limit (even one named "fleet") drains nothing.
- memtally-slurm-task under srun: a job whose --mem fits runs under
  `memtally run` (its task name and group set); one whose --mem does not
  fit fails with exit status 3 and its command never starts.
- memtally-slurm-taskprolog (TaskProlog): a plain srun task is counted,
  as its partition's group.
- Fleet over budget: the hook drains the node (reason "memtally: fleet over
  budget") and a newly submitted job stays pending; fleet back under: the
  hook resumes the node and the job runs. A node an administrator drained
  stays drained, with its reason, through memtally's over and back.

Environment: as for the integration tests, and MEMTALLY_SOURCE_DIR.
"""
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile

from harness import (MULT, Server, Skip, Worker, check, config_file, run,
                     wait_for, worker)

SRC = os.environ["MEMTALLY_SOURCE_DIR"]
SLURM = os.path.join(SRC, "deploy", "slurm")
HOOK = os.path.join(SLURM, "memtally-slurm-hook")
REASON = "memtally: fleet over budget"


def need():
    for tool, pkg in (("munged", "munge"), ("mungekey", "munge"),
                      ("slurmctld", "slurm-wlm"), ("slurmd", "slurm-wlm"),
                      ("scontrol", "slurm-wlm"), ("sbatch", "slurm-wlm"),
                      ("sinfo", "slurm-wlm")):
        if not shutil.which(tool, path=os.environ.get("PATH", "") +
                            ":/usr/sbin:/sbin"):
            raise Skip(f"{tool} is not installed (apt-get install {pkg})")
    if os.geteuid() != 0:
        raise Skip("slurmd must run as root to start jobs")


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def sbin(tool):
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


class Cluster:
    """munged + slurmctld + slurmd in a temporary directory."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.node = socket.gethostname().split(".")[0]
        self.procs = []
        m = os.path.join(tmp, "munge")
        os.mkdir(m, 0o700)
        self.munge_sock = os.path.join(m, "munge.socket")
        key = os.path.join(m, "munge.key")
        subprocess.run([sbin("mungekey"), "--create", "--keyfile", key],
                       check=True, capture_output=True)
        # --force: munged refuses a socket directory others cannot search
        # (ours is private to this test) and running as root without it.
        self.start("munged", [sbin("munged"), "-F", "--force",
                              f"--socket={self.munge_sock}",
                              f"--key-file={key}",
                              f"--pid-file={m}/munged.pid",
                              f"--seed-file={m}/munged.seed",
                              f"--log-file={m}/munged.log"])
        wait_for("munged socket", lambda: self.alive()
                 and os.path.exists(self.munge_sock), timeout=20)
        ctld_port, d_port = free_ports(2)
        for d in ("ctld", "spool", "log"):
            os.mkdir(os.path.join(tmp, d))
        self.conf = os.path.join(tmp, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(f"""\
ClusterName=memtally
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={self.munge_sock}
CredType=cred/munge
StateSaveLocation={tmp}/ctld
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/log/slurmctld.log
SlurmdLogFile={tmp}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog={SLURM}/memtally-slurm-taskprolog
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1024 State=UNKNOWN
PartitionName=mt Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        os.environ["SLURM_CONF"] = self.conf
        self.start("slurmctld", [sbin("slurmctld"), "-D", "-i", "-f", self.conf])
        self.start("slurmd", [sbin("slurmd"), "-D", "-f", self.conf])
        wait_for("node idle", lambda: self.alive()
                 and self.node_state()[0].startswith("idle"), timeout=60,
                 interval=0.2)

    def start(self, name, argv):
        log = open(os.path.join(self.tmp, f"{name}.out"), "w")
        self.procs.append((name, subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)))

    def alive(self):
        for name, p in self.procs:
            if p.poll() is not None:
                raise AssertionError(f"{name} exited {p.returncode}: "
                                     + self.logs())
        return True

    def logs(self):
        out = []
        for name in ("munged.out", "slurmctld.out", "slurmd.out",
                     "log/slurmctld.log", "log/slurmd.log"):
            try:
                with open(os.path.join(self.tmp, name)) as f:
                    out.append(f"---- {name} ----\n" + f.read()[-3000:])
            except FileNotFoundError:
                pass
        return "\n".join(out)

    def cmd(self, *argv):
        r = subprocess.run(argv, capture_output=True, text=True,
                           timeout=30 * MULT)
        check(r.returncode == 0, f"{' '.join(argv)}: {r.returncode} "
              f"{r.stdout}{r.stderr}")
        return r.stdout.strip()

    def node_state(self):
        """(state, reason) of our node, as sinfo has them."""
        out = self.cmd("sinfo", "-h", "-N", "-n", self.node, "-o", "%T|%E")
        state, _, reason = out.partition("|")
        return state, reason

    def sbatch(self, *args, env=None):
        r = subprocess.run(["sbatch", "--parsable", "-D", self.tmp,
                            "-o", f"{self.tmp}/job-%j.out", *args],
                           capture_output=True, text=True, env=env,
                           timeout=30 * MULT)
        check(r.returncode == 0, f"sbatch {args}: {r.stdout}{r.stderr}")
        return r.stdout.strip().split(";")[0]

    def job(self, jobid):
        """JobState, Reason and ExitCode of a job (kept MinJobAge, 300 s)."""
        out = self.cmd("scontrol", "-o", "show", "job", jobid)
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return fields

    def wait_done(self, jobid, timeout=40):
        return wait_for(f"job {jobid} done", lambda: (
            self.alive() and self.job(jobid)["JobState"] in
            ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
            and self.job(jobid)), timeout=timeout, interval=0.2)

    def stop(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def read(path):
    with open(path) as f:
        return f.read()


def test_shipped_config_accepted():
    """deploy/slurm/memtallyd.conf is a config memtallyd starts with."""
    with Server("--config", os.path.join(SLURM, "memtallyd.conf")) as s:
        check(s.status()["fleet"]["limit"] == 200 << 30, "fleet limit")


def test_readme_install_step_gives_a_config_memtallyd_starts_with():
    """The README's step that writes /etc/memtally/memtallyd.conf, run on
    what the package's postinst leaves there (the example, its socket group
    set), gives a config memtallyd starts with. memtallyd refuses a key
    given twice, and the example sets most of the Slurm file's keys: the
    Slurm file appended to it never started."""
    with open(os.path.join(SLURM, "README.md")) as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    steps = [ln for ln in lines if "/etc/memtally/memtallyd.conf" in ln
             and ">" in ln and not ln.lstrip().startswith("#")]
    check(len(steps) == 1, f"one install step writes the config: {steps}")
    tmp = tempfile.mkdtemp(prefix="mt-slurm-conf-")
    conf = os.path.join(tmp, "memtallyd.conf")
    with open(os.path.join(SRC, "deploy", "memtallyd.conf")) as f:
        example = f.read()
    with open(conf, "w") as f:
        f.write(example.replace("\n;group = memtally\n",
                                "\ngroup = memtally\n"))
    # The step, after the variables its block sets before it.
    block = lines[:lines.index(steps[0])]
    start = max(i for i, ln in enumerate(block) if ln.startswith("```"))
    sets = [ln for ln in block[start + 1:] if re.match(r"\w+=\S", ln)]
    step = ("\n".join(sets + steps)
            .replace("/usr/share/doc/memtally/examples/slurm/", SLURM + "/")
            .replace("/etc/memtally/memtallyd.conf", conf))
    # Without the Slurm file (an image without /usr/share/doc) the
    # example stays as it was, not emptied.
    missing = step.replace(SLURM + "/", os.path.join(tmp, "none") + "/")
    subprocess.run(["sh", "-c", missing], cwd=SRC, capture_output=True,
                   timeout=30 * MULT)
    with open(conf) as f:
        check(f.read() == example.replace("\n;group = memtally\n",
                                          "\ngroup = memtally\n"),
              "the config changed without the Slurm file")
    r = subprocess.run(["sh", "-c", step], cwd=SRC, capture_output=True,
                       text=True, timeout=30 * MULT)
    check(r.returncode == 0, f"{step}: {r.stderr.strip()}")
    with open(conf) as f:
        text = f.read()
    check("\ngroup = memtally\n" in text,
          "the step sets the socket's group, as postinst does")
    # The memtally group may not exist here: the test's own group.
    with open(conf, "w") as f:
        f.write(text.replace("\ngroup = memtally\n",
                             f"\ngroup = {os.getgid()}\n"))
    try:
        with Server("--config", conf) as s:
            check(s.status()["fleet"]["limit"] == 200 << 30, "fleet limit")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_slurm_drain_resume_and_task_wrapper():
    need()
    tmp = tempfile.mkdtemp(prefix="mt-slurm-")
    os.chmod(tmp, 0o755)
    cluster = None
    hog = None
    try:
        cluster = Cluster(tmp)
        conf = config_file(f"""\
[limits]
fleet = 64MiB
[group fleet]
limit = 1MiB
[hooks]
on_ok = {HOOK}
on_high = {HOOK}
on_over = {HOOK}
timeout = 20s
""")
        # A node a memtallyd drained before it stopped (the fleet went
        # over, then memtallyd was restarted): the fleet's hook at start
        # resumes it; nothing else would until the fleet next went over.
        cluster.cmd("scontrol", "update", f"nodename={cluster.node}",
                    "state=drain", f"reason={REASON}")
        check(cluster.node_state()[0].startswith("drain"), "not drained")
        with Server("--config", conf) as s:
            wait_for("node resumed at memtallyd's start", lambda: (
                cluster.node_state()[0] == "idle"), timeout=30, interval=0.2)
            check('msg="hook finished" scope="fleet" state=ok '
                  'previous=unknown' in s.logtext(), "no start hook logged")
            env = dict(os.environ, MEMTALLY=os.environ["MEMTALLY_CLI"],
                       MEMTALLY_SOCKET=s.socket,
                       MEMTALLY_PRELOAD=os.environ["MEMTALLY_PRELOAD_LIB"],
                       PATH=f"{SLURM}:{os.environ['PATH']}")
            hold = worker("hold")

            # A group over its limit, even one named "fleet", drains nothing.
            g = Worker([*hold, "4"], s.env(group="fleet"))
            check(g.readline().startswith("ready"), "worker not ready")
            wait_for("the group's hook ran", lambda: 'msg="hook finished" '
                     'scope="fleet" state=over' in s.logtext(), timeout=30)
            g.close()
            check(s.status()["fleet"]["state"] == "ok", "fleet not ok")
            st = cluster.node_state()
            check(st[0] == "idle" and st[1] == "none",
                  f"node after a group named fleet went over: {st}")

            # A task that fits: admitted, runs under memtally run.
            out = os.path.join(tmp, "fits.out")
            j = cluster.sbatch("--mem=16M", "--wrap",
                               "srun memtally-slurm-task -- sh -c "
                               f"'echo \"$MEMTALLY_TASK $MEMTALLY_GROUP\" > {out}'",
                               env=env)
            job = cluster.wait_done(j)
            check(job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0",
                  f"job {j}: {job}\n" + read(f"{tmp}/job-{j}.out"))
            check(read(out).split() == [f"slurm-{j}.0.0", "mt"],
                  f"task and group in the job: {read(out)!r}")
            check(s.status()["fleet"]["reserved"] == 0, "reservation left")

            # A task that does not fit (100 MiB > 64 MiB): exit 3, the
            # command never started.
            out2 = os.path.join(tmp, "too-big.out")
            j = cluster.sbatch("--mem=100M", "--wrap",
                               f"srun memtally-slurm-task -- touch {out2}",
                               env=env)
            job = cluster.wait_done(j)
            check(job["JobState"] == "FAILED" and job["ExitCode"] == "3:0",
                  f"job {j}: {job}\n" + read(f"{tmp}/job-{j}.out"))
            check(not os.path.exists(out2), "denied command ran")
            check(s.status()["fleet"]["reserved"] == 0, "reservation left")

            # The TaskProlog alone: a plain srun task is counted, as the
            # partition's group.
            j = cluster.sbatch(
                "--wrap", f"srun {shlex.join(hold)} 8 </dev/null", env=env)
            job = cluster.wait_done(j)
            check(job["JobState"] == "COMPLETED", f"job {j}: {job}")
            check('group="mt" task="" comm="mt_worker"' in s.logtext(),
                  "TaskProlog's task not registered as group mt:\n"
                  + s.logtext()[-3000:])

            # Over budget: drained, and a new job stays pending.
            hog = Worker([*hold, "80"], s.env(group="hog"))
            check(hog.readline().startswith("ready"), "hog not ready")
            wait_for("node drained by the hook", lambda: (
                lambda st: st[0].startswith("drain") and st[1] == REASON)(
                    cluster.node_state()), timeout=30, interval=0.2)
            out3 = os.path.join(tmp, "later.out")
            j = cluster.sbatch("--wrap", f"echo ran > {out3}", env=env)
            # slurmctld has looked at it (a reason other than None) and left
            # it pending because of the drained node.
            job = wait_for("job considered", lambda: (
                lambda f: f["Reason"] not in ("None", "") and f)(cluster.job(j)),
                timeout=30, interval=0.2)
            check(job["JobState"] == "PENDING" and ("DRAINED" in job["Reason"]
                  or "ReqNodeNotAvail" in job["Reason"]),
                  f"job {j} while drained: {job}")
            check(not os.path.exists(out3), "job ran on a drained node")

            # Back under: resumed, the job runs.
            hog.send("free")
            check(hog.readline() == "freed", "hog did not free")
            wait_for("node resumed by the hook", lambda: (
                cluster.node_state()[0] in ("idle", "mixed", "allocated",
                                            "completing")), timeout=30,
                interval=0.2)
            job = cluster.wait_done(j)
            check(job["JobState"] == "COMPLETED" and read(out3) == "ran\n",
                  f"job {j} after resume: {job}")
            log = s.logtext()
            check("drained" in log and "resumed" in log,
                  "hook output not in memtallyd's log:\n" + log[-3000:])

            # A node an administrator drained keeps its drain and reason
            # through a fleet over and back.
            admin = "admin: new disk"
            cluster.cmd("scontrol", "update", f"nodename={cluster.node}",
                        "state=drain", f"reason={admin}")
            # Back to ok, from over or through high (the figure may pass
            # the high mark on its way down, as the hog's pages go).
            back = 'msg="hook finished" scope="fleet" state=ok previous='

            def count_backs():
                """Hooks back to ok (not the one at start: unknown)."""
                t = s.logtext()
                return t.count(back + "over") + t.count(back + "high")
            # The first hook back to ok resumed the node before memtallyd
            # logged that it finished: wait for that line before counting.
            backs = wait_for("the first hook back to ok finished", lambda: (
                lambda n: n if n >= 1 else None)(count_backs()),
                timeout=30)
            hog.send("more 80")
            check(hog.readline().startswith("ready"), "hog not ready")
            wait_for("fleet over", lambda: s.status()["fleet"]["state"] == "over")
            hog.send("free")
            check(hog.readline() == "freed", "hog did not free")
            wait_for("fleet ok", lambda: s.status()["fleet"]["state"] == "ok")
            wait_for("the hook back to ok ran", lambda: count_backs() ==
                     backs + 1, timeout=30)
            st = cluster.node_state()
            check(st[0].startswith("drain") and st[1] == admin,
                  f"administrator's drain after memtally's over and ok: {st}")
            hog.close()
            hog = None
    except BaseException:
        if cluster:
            print(cluster.logs())
        raise
    finally:
        if hog:
            hog.kill()
        if cluster:
            cluster.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_task_wrapper_gives_each_task_its_share_of_the_node():
    """--mem is per node: each of this node's tasks of the step gets its
    share. srun says how many run here in SLURM_STEP_TASKS_PER_NODE
    ("2(x3),1") at SLURM_NODEID; SLURM_NTASKS_PER_NODE is set only with
    --ntasks-per-node. No Slurm needed: the wrapper's arguments to a
    stand-in `memtally`."""
    tmp = tempfile.mkdtemp(prefix="mt-slurm-args-")
    stub = os.path.join(tmp, "memtally")
    with open(stub, "w") as f:
        f.write('#!/bin/sh\n[ "$1" = run ] && shift\nprintf "%s\\n" "$@"\n')
    os.chmod(stub, 0o755)
    cases = [
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "1"},
         "8192MiB"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"},
         "16384MiB"),
        ({"SLURM_STEP_TASKS_PER_NODE": "8", "SLURM_NODEID": "0"}, "2048MiB"),
        ({"SLURM_NTASKS_PER_NODE": "4"}, "4096MiB"),
        ({}, "16384MiB"),
        # --mem=0 is "all of the node's memory": nothing declared, where
        # --bytes 0MiB would make memtally run refuse the task.
        ({"SLURM_MEM_PER_NODE": "0"}, None),
        ({"SLURM_MEM_PER_CPU": "0", "SLURM_CPUS_PER_TASK": "4"}, None),
        ({"SLURM_MEM_PER_NODE": "3", "SLURM_NTASKS_PER_NODE": "4"}, None),
    ]
    for extra, want in cases:
        env = {"PATH": os.environ["PATH"], "MEMTALLY": stub,
               "SLURM_MEM_PER_NODE": "16384", **extra}
        r = subprocess.run(["sh", os.path.join(SLURM, "memtally-slurm-task"),
                            "true"], env=env, capture_output=True, text=True,
                           timeout=30 * MULT)
        args = r.stdout.split("\n")
        got = args[args.index("--bytes") + 1] if "--bytes" in args else None
        check(r.returncode == 0 and got == want,
              f"{extra}: --bytes {got}, want {want} ({r.stderr.strip()})")
        print(f"  {extra or 'no task count'}: --bytes {got}")


def test_task_wrapper_names_a_wrap_jobs_kind_by_its_command():
    """Slurm names every `sbatch --wrap` job "wrap": one kind for every
    such command, learned as the largest of them. Its task's kind is
    "wrap:" and the command's name, past memtally run's options ("wrap"
    when that is not plainly a name); a job name of its own, or
    MEMTALLY_KIND, is kept as it is. No Slurm needed: the wrapper's
    arguments to a stand-in `memtally`."""
    tmp = tempfile.mkdtemp(prefix="mt-slurm-wrap-")
    stub = os.path.join(tmp, "memtally")
    with open(stub, "w") as f:
        f.write('#!/bin/sh\n[ "$1" = run ] && shift\nprintf "%s\\n" "$@"\n')
    os.chmod(stub, 0o755)
    cases = [
        ({"SLURM_JOB_NAME": "wrap"}, ["./bin/simulate", "in.dat"],
         "wrap:simulate"),
        ({"SLURM_JOB_NAME": "wrap"}, ["--wait", "5", "--", "python3", "a.py"],
         "wrap:python3"),
        ({"SLURM_JOB_NAME": "wrap"}, ["--retry=1", "xz", "-9"], "wrap:xz"),
        ({"SLURM_JOB_NAME": "wrap", "MEMTALLY_KIND": "mine"}, ["xz"],
         "mine"),
        # Not plainly a name, or none: "wrap", as before.
        ({"SLURM_JOB_NAME": "wrap"}, ["caf\u00e9"], "wrap"),
        ({"SLURM_JOB_NAME": "wrap"}, ["x" * 300], "wrap"),
        ({"SLURM_JOB_NAME": "wrap"}, ["./dir/"], "wrap"),
        ({"SLURM_JOB_NAME": "wrap"}, [""], "wrap"),
        ({"SLURM_JOB_NAME": "nightly"}, ["xz"], "nightly"),
    ]
    for extra, argv, want in cases:
        env = {"PATH": os.environ["PATH"], "MEMTALLY": stub, **extra}
        r = subprocess.run(["sh", os.path.join(SLURM, "memtally-slurm-task"),
                            *argv], env=env, capture_output=True, text=True,
                           timeout=30 * MULT)
        args = r.stdout.split("\n")
        got = args[args.index("--kind") + 1] if "--kind" in args else None
        check(r.returncode == 0 and got == want,
              f"{extra} {argv}: --kind {got}, want {want} "
              f"({r.stderr.strip()})")
        check("not a kind" not in r.stderr, f"{argv}: {r.stderr}")
        print(f"  {extra['SLURM_JOB_NAME']} {shlex.join(argv)[:40]}: "
              f"--kind {got}")


def test_task_wrapper_without_memtally_runs_the_command():
    """memtally not installed: the wrapper runs the command itself, past
    the options memtally run would have taken, with or without "--" (a
    "--" among the command's own arguments stays theirs). No Slurm
    needed."""
    env = {"PATH": os.environ["PATH"], "MEMTALLY": "/nonexistent/memtally"}
    wrapper = os.path.join(SLURM, "memtally-slurm-task")
    cases = [
        (["--wait", "5", "printf", "%s,", "a", "b"], 0, "a,b,"),
        (["--wait", "5", "--", "printf", "%s,", "--", "x"], 0, "--,x,"),
        (["--bytes=1G", "--retry", "2", "printf", "y"], 0, "y"),
        (["printf", "%s", "--"], 0, "--"),
        (["--wait"], 2, ""),
        (["--bogus", "printf", "z"], 2, ""),
    ]
    for argv, rc, out in cases:
        r = subprocess.run(["sh", wrapper, *argv], env=env,
                           capture_output=True, text=True, timeout=30 * MULT)
        check(r.returncode == rc and r.stdout == out,
              f"{argv}: exit {r.returncode} {r.stdout!r}, want {rc} "
              f"{out!r} ({r.stderr.strip()})")
        print(f"  {shlex.join(argv)}: exit {r.returncode} {r.stdout!r}")


def test_hook_resumes_its_drain_after_a_restart_while_high():
    """A memtallyd restarted while the fleet is high (its start hook:
    MEMTALLY_PREVIOUS=unknown) resumes the node its predecessor drained,
    as from over -> high; it leaves one an administrator drained, and
    does nothing on ok -> high. The hook's arguments to a stand-in
    `scontrol`: no Slurm needed."""
    tmp = tempfile.mkdtemp(prefix="mt-slurm-hook-")
    stub, calls = os.path.join(tmp, "scontrol"), os.path.join(tmp, "calls")
    with open(stub, "w") as f:
        f.write('#!/bin/sh\nif [ "$1" = -o ]; then\n'
                '  echo "NodeName=n1 State=IDLE+DRAIN Reason=$NODE_REASON '
                '[root@2026-12-07T01:00:00]"\nelse\n'
                f'  echo "$*" >> {calls}\nfi\n')
    os.chmod(stub, 0o755)
    cases = [("unknown", REASON, True), ("unknown", "maintenance", False),
             ("ok", REASON, False), ("over", REASON, True)]
    for previous, reason, resumed in cases:
        if os.path.exists(calls):
            os.unlink(calls)
        env = {"PATH": os.environ["PATH"], "SCONTROL": stub,
               "NODE_REASON": reason, "MEMTALLY_SCOPE": "fleet",
               "MEMTALLY_STATE": "high", "MEMTALLY_PREVIOUS": previous,
               "MEMTALLY_BYTES": "60 MiB", "MEMTALLY_RESERVED": "0 B",
               "MEMTALLY_LIMIT": "64 MiB"}
        r = subprocess.run(["sh", HOOK, "n1"], env=env, capture_output=True,
                           text=True, timeout=30 * MULT)
        got = read(calls) if os.path.exists(calls) else ""
        check(r.returncode == 0 and
              (got == "update nodename=n1 state=resume\n") == resumed and
              (got == "") == (not resumed),
              f"{previous} -> high, reason {reason!r}: exit "
              f"{r.returncode}, scontrol {got!r} ({r.stderr.strip()})")
        print(f"  {previous} -> high, reason {reason!r}: "
              f"{'resumed' if resumed else 'left as it is'}")


def test_task_wrapper_runs_a_job_whose_name_memtally_refuses():
    """Slurm takes job names memtally run refuses as a kind (a tab, a
    bidi mark, 200 "é": over 255 bytes) and account names longer than a
    group's 63 bytes: memtally run exited 2 and every task of the job
    failed before it started. The wrapper leaves such a name out (said
    once) and the task runs. The real CLI, memtallyd absent (fail open).
    No Slurm needed."""
    cli = os.environ["MEMTALLY_CLI"]
    wrapper = os.path.join(SLURM, "memtally-slurm-task")
    tmp = tempfile.mkdtemp(prefix="mt-slurm-names-")
    cases = [({"SLURM_JOB_NAME": "sim\tx"}, "kind"),
             ({"SLURM_JOB_NAME": "sim\u200f"}, "kind"),
             ({"SLURM_JOB_NAME": "\u00e9" * 200}, "kind"),
             ({"SLURM_JOB_ACCOUNT": "a" * 70}, "group"),
             ({"MEMTALLY_GROUP": "g" * 70}, "group"),
             ({"SLURM_JOB_NAME": "a plain name"}, None)]
    for i, (extra, dropped) in enumerate(cases):
        made = os.path.join(tmp, str(i))
        env = {"PATH": os.environ["PATH"], "MEMTALLY": cli,
               "MEMTALLY_SOCKET": os.path.join(tmp, "none.sock"),
               "MEMTALLY_PRELOAD_LIB": "", **extra}
        r = subprocess.run(["sh", wrapper, "touch", made], env=env,
                           capture_output=True, text=True, timeout=30 * MULT)
        said = f"running without a {dropped}" in r.stderr if dropped \
            else "running without a" not in r.stderr
        check(r.returncode == 0 and os.path.exists(made) and said,
              f"{extra!r}: exit {r.returncode}, "
              f"{'ran' if os.path.exists(made) else 'not run'}: {r.stderr}")
        print(f"  {list(extra)[0]} {dropped or 'kept'}: ran")


if __name__ == "__main__":
    run([test_shipped_config_accepted,
         test_readme_install_step_gives_a_config_memtallyd_starts_with,
         test_task_wrapper_gives_each_task_its_share_of_the_node,
         test_task_wrapper_without_memtally_runs_the_command,
         test_task_wrapper_names_a_wrap_jobs_kind_by_its_command,
         test_task_wrapper_runs_a_job_whose_name_memtally_refuses,
         test_hook_resumes_its_drain_after_a_restart_while_high,
         test_slurm_drain_resume_and_task_wrapper])
