"""memtally's command line refuses what it cannot do before it connects:
each mistake gets exit status 2 and one line on stderr that names it, and
nothing on stdout; --help and --version answer without a server."""
import subprocess

from harness import CLI, check, run

# (arguments, what stderr must say)
MISTAKES = [
    ([], "no command given"),
    (["--bogus", "status"], "unknown option '--bogus'"),
    (["-x", "status"], "unknown option '-x'"),
    (["--json=1", "status"], "option '--json' takes no value"),
    (["status", "--timeout"], "option '--timeout' needs a value"),
    (["--timeout", "0", "status"], "invalid --timeout '0'"),
    (["nosuch"], "unknown command 'nosuch'"),
    (["status", "extra"], "status: unexpected argument 'extra'"),
    (["limit"], "limit: missing argument"),
    (["ps", "--bytes", "5"], "ps: --bytes does not apply"),
    (["--socket", "/a", "--tcp", "b:1", "status"],
     "--socket and --tcp exclude each other"),
    (["admit", "--bytes", "zz"], "invalid --bytes 'zz'"),
    (["--socket", "", "status"], "--socket needs a path"),
    # Names memtallyd would refuse: not taken for a server that does not
    # answer, which would run the command unadmitted.
    (["run", "--bytes", "1G", "--group", "a" * 256, "--", "true"],
     "run: --group is not a name memtallyd takes"),
    (["run", "--kind", "a\tb", "--", "true"],
     "run: --kind is not a name memtallyd takes"),
    (["run", "--bytes", "1G", "--task", "a\u202eb", "--", "true"],
     "run: --task is not a name memtallyd takes"),
    # A task name a worker cuts (it keeps 63 bytes of MEMTALLY_TASK):
    # granted, it would never be taken over.
    (["admit", "--bytes", "1G", "--task", "t" * 64],
     "admit: --task is 64 bytes, at most 63"),
    # Said here with exit 2, naming the flag, not sent for memtallyd's
    # refusal (exit 1).
    (["admit", "--bytes", "1M", "--group", "a\tb"],
     "admit: --group is not a name memtallyd takes"),
    (["admit", "--kind", "k\u202ex"],
     "admit: --kind is not a name memtallyd takes"),
    (["admit", "--bytes", "1M", "--ttl", "4294967296"],
     "expected seconds from 1 to 4294967295"),
    # jq's "null" for a denial's missing id: the command would run
    # unadmitted.
    (["run", "--reservation", "null", "--task", "t", "--", "true"],
     "invalid --reservation 'null'"),
    # Past 2^63 - 1 no count is real, and JSON could not say it back.
    (["limit", "set", "fleet", "9000000T"], "'9000000T' is too large"),
]


def test_usage_errors():
    for args, says in MISTAKES:
        # A socket that does not exist: a mistake must be caught before
        # any connection is tried.
        r = subprocess.run([CLI, *args], capture_output=True, text=True,
                           env={"MEMTALLY_SOCKET": "/nonexistent/sock"})
        check(r.returncode == 2, f"{args}: exit {r.returncode}, "
              f"stderr {r.stderr!r}")
        check(says in r.stderr and r.stderr.count("\n") == 1,
              f"{args}: stderr {r.stderr!r}, expected {says!r}")
        check(r.stdout == "", f"{args}: stdout {r.stdout!r}")
    print(f"  {len(MISTAKES)} mistakes refused with exit 2", flush=True)


def test_help_and_version_need_no_server():
    env = {"MEMTALLY_SOCKET": "/nonexistent/sock"}
    h = subprocess.run([CLI, "--help"], capture_output=True, text=True,
                       env=env)
    check(h.returncode == 0 and h.stdout.startswith("Usage: memtally"),
          f"--help: {h.returncode} {h.stdout[:80]!r}")
    v = subprocess.run([CLI, "-V"], capture_output=True, text=True, env=env)
    check(v.returncode == 0 and v.stdout.startswith("memtally "),
          f"-V: {v.returncode} {v.stdout!r}")
    down = subprocess.run([CLI, "status"], capture_output=True, text=True,
                          env=env)
    check(down.returncode == 1 and "is memtallyd running?" in down.stderr,
          f"no server: {down.returncode} {down.stderr!r}")


def test_run_after_a_double_dash():
    """Options may come before the command, "--" included: "memtally --
    run -- CMD" runs CMD (it was "unexpected argument")."""
    env = {"MEMTALLY_SOCKET": "/nonexistent/sock", "MEMTALLY_DISABLE": "1"}
    for args in (["--", "run", "--", "sh", "-c", "exit 7"],
                 ["--", "run", "sh", "-c", "exit 7"]):
        r = subprocess.run([CLI, *args], capture_output=True, text=True,
                           env=env)
        check(r.returncode == 7, f"{args}: exit {r.returncode}, "
              f"stderr {r.stderr!r}")


if __name__ == "__main__":
    run([test_usage_errors, test_help_and_version_need_no_server,
         test_run_after_a_double_dash])
