"""The socket is born with its mode and group, in a directory nobody else
can change.

memtallyd used to bind its socket, then chmod and chown it by path: whoever
could write the socket's directory could swap in a symlink between the two,
and root's chmod/chown then made any file 0660 and gave it to the socket's
group. Now it refuses, at start, a socket or state-file directory (or any
directory above it) owned by another user, or writable by group or others
without the sticky bit; and it makes the socket in a private directory and
renames it into place, so nothing is changed by path.

  test_unsafe_dirs_refused   another user's directory, 0777 without the
                             sticky bit (the socket's own, one above it, a
                             --state file's): exit 2, one line naming it;
                             0700, 0755 and 1777 (like /tmp) are accepted.
  test_attacker_dir_race     the attack: an attacker owning the socket's
                             directory swaps a symlink to a root file for
                             the socket as fast as it can while memtallyd
                             starts, again and again: the file never
                             changes (memtallyd refuses the directory).
  test_sticky_dir_race       the same attacker in a root-owned sticky,
                             world-writable directory (like /tmp), where
                             memtallyd does start: the file never changes
                             and the socket is 0660, group nogroup, each
                             time it is up (the old code passes this one:
                             a sticky directory already kept the attacker
                             from replacing root's socket).
200 tries each, about 6 s each on an idle machine (20 under a sanitizer).
  test_symlinks_on_the_path  a symlink on the socket's path that another
                             user owns (in a root directory, or made in a
                             sticky one like /tmp, or second in a chain):
                             exit 2, one line naming the link and its
                             owner, even though it points at a root
                             directory (its owner could re-point it at a
                             directory of theirs and run a fake server
                             there); a root symlink in a directory another
                             user owns: refused, naming the directory; a
                             root symlink in root's directories (/run ->
                             /var/run): accepted.
"""
import os
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (as_user, MEMTALLYD, MULT, NOBODY, NOGROUP,  # noqa: E402
                     check, run, second_user, terminate, wait_for)

# Under a sanitizer (MULT > 1) each start is several times slower, and
# the point there is the checks' code under ASan/TSan, not the race's odds.
TRIES = 200 if MULT <= 1 else 20
ATTACKER = r"""
import os, stat, sys
d, target = sys.argv[1], sys.argv[2]
sock = os.path.join(d, "s")
link = os.path.join(d, "atk-%d" % os.getpid())
print("ready", flush=True)
while True:
    try:
        os.symlink(target, link)
    except FileExistsError:
        pass
    except OSError:
        continue
    try:
        if stat.S_ISSOCK(os.lstat(sock).st_mode):
            os.rename(link, sock)   # the socket becomes our symlink
    except OSError:
        pass
"""


class Daemon:
    """memtallyd on `sock`, [server] group = nogroup, its output in a
    file (read while it runs)."""

    def __init__(self, sock, *extra):
        self.out = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [MEMTALLYD, "--socket", sock,
             "--segment", f"/mt-it-sd-{os.getpid()}", "--log-level", "info",
             *extra, "--config", group_conf()],
            stdout=self.out, stderr=subprocess.STDOUT, text=True)

    def text(self):
        self.out.seek(0)
        return self.out.read()

    def settle(self):
        """Wait until it listens (True) or has exited (False)."""
        return wait_for("memtallyd listening or gone", lambda: (
            "exited" if self.proc.poll() is not None else
            "up" if 'msg="listening"' in self.text() else None),
            timeout=15) == "up"

    def stop(self):
        """SIGTERM if running; its exit status."""
        if self.proc.poll() is None:
            rc = terminate(self.proc, self.text)
            if rc is not None:
                return rc
            self.proc.kill()
        return self.proc.wait()


_conf = []


def group_conf():
    if not _conf:
        d = tempfile.mkdtemp(prefix="mt-it-cfg-")
        path = os.path.join(d, "memtallyd.conf")
        with open(path, "w") as f:
            f.write(f"[server]\ngroup = {NOGROUP}\n")
        _conf.append(path)
    return _conf[0]


def refused(sock, name, *extra):
    """memtallyd on `sock` exits 2 with one line naming directory `name`."""
    p = Daemon(sock, *extra)
    up = p.settle()
    rc = p.stop()
    out = p.text()
    check(not up and rc == 2, f"started, or exit {rc}, for {sock}: {out}")
    lines = [ln for ln in out.splitlines() if "unsafe" in ln]
    check(len(lines) == 1 and f"directory {name} " in lines[0],
          f"no line naming {name}: {out}")
    check(not os.path.lexists(sock), f"{sock} made anyway")


def accepted(sock):
    p = Daemon(sock)
    up = p.settle()
    st = os.lstat(sock) if up else None
    rc = p.stop()
    check(up, f"did not start on {sock}: {p.text()}")
    check(st.st_mode & 0o7777 == 0o660 and st.st_gid == NOGROUP,
          f"socket mode {st.st_mode & 0o7777:o} gid {st.st_gid}")
    check(rc == 0, f"exit {rc}")
    check(not os.path.lexists(sock), "socket left behind")


def test_unsafe_dirs_refused():
    uid, gid = second_user()
    theirs = tempfile.mkdtemp(prefix="mt-it-theirs-")
    os.chown(theirs, uid, gid)
    os.chmod(theirs, 0o755)
    refused(os.path.join(theirs, "s"), theirs)

    open777 = tempfile.mkdtemp(prefix="mt-it-777-")
    os.chmod(open777, 0o777)
    refused(os.path.join(open777, "s"), open777)
    # One level down, root's own 0755 directory: still swappable.
    sub = os.path.join(open777, "sub")
    os.mkdir(sub, 0o755)
    refused(os.path.join(sub, "s"), open777)
    # Not there yet (memtallyd would make it): the existing parent counts.
    refused(os.path.join(open777, "new", "s"), open777)
    # A restart record elsewhere, in a directory anyone can write.
    good = tempfile.mkdtemp(prefix="mt-it-good-")
    refused(os.path.join(good, "s"), open777,
            "--state", os.path.join(open777, "x.state"))

    accepted(os.path.join(good, "s"))        # 0700, like the harness's
    os.chmod(good, 0o755)
    accepted(os.path.join(good, "s"))
    sticky = tempfile.mkdtemp(prefix="mt-it-1777-")
    os.chmod(sticky, 0o1777)
    accepted(os.path.join(sticky, "s"))


def attacker(d, target, user):
    # The distribution's interpreter: another user may not reach ours.
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else \
        sys.executable
    a = subprocess.Popen([py, "-c", ATTACKER, d, target],
                         stdout=subprocess.PIPE, text=True, preexec_fn=as_user(user))
    check(a.stdout.readline().strip() == "ready", "attacker did not start")
    return a


def victim_file():
    """A root file 0600 the attacker would like to own: its mode and owner
    are what a chmod/chown by path through a symlink would change."""
    d = tempfile.mkdtemp(prefix="mt-it-victim-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "secret")
    with open(path, "w") as f:
        f.write("root only\n")
    os.chmod(path, 0o600)
    return path


def unchanged(path):
    st = os.stat(path)
    return (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o600, 0, 0)


def race(d, user, expect_start):
    """TRIES starts of memtallyd on d/s while the attacker swaps symlinks
    to a root file in for the socket. Returns how many came up."""
    target = victim_file()
    sock = os.path.join(d, "s")
    a = attacker(d, target, user)
    ups = 0
    end = time.monotonic() + 50 * MULT
    try:
        for i in range(TRIES):
            check(time.monotonic() < end, f"only {i} tries in 50 s")
            p = Daemon(sock)
            up = p.settle()
            st = os.lstat(sock) if up else None
            rc = p.stop()
            out = p.text()
            check(unchanged(target),
                  f"try {i}: the root file was changed through the "
                  f"socket path: {oct(os.stat(target).st_mode)} "
                  f"gid {os.stat(target).st_gid}\n{out}")
            ups += up
            if up and expect_start:
                check(stat.S_ISSOCK(st.st_mode) and
                      st.st_mode & 0o7777 == 0o660 and
                      st.st_gid == NOGROUP,
                      f"try {i}: socket mode {st.st_mode:o} "
                      f"gid {st.st_gid}")
            elif expect_start:
                # The attacker's symlink got to a free path first: it is
                # refused, never followed (a denial of service any user
                # of a shared directory can cause). Before the check of
                # the path, it is "not a socket"; between that check and
                # the rename into place, RENAME_NOREPLACE keeps it there
                # and the path is taken.
                check(rc == 1 and ("exists and is not a socket" in out or
                                   ('"cannot listen on socket"' in out and
                                    "Address already in use" in out)),
                      f"try {i}: exit {rc}: {out}")
            elif not up:
                check(rc == 2 and f"directory {d} " in out,
                      f"try {i}: exit {rc}: {out}")
            # What the attacker left at the path (a symlink) is removed
            # for the next try; a live server is gone by now.
            try:
                os.unlink(sock)
            except FileNotFoundError:
                pass
    finally:
        a.kill()
        a.wait()
    return ups


def test_attacker_dir_race():
    user = second_user()
    d = tempfile.mkdtemp(prefix="mt-it-race-")
    os.chown(d, user[0], user[1])
    os.chmod(d, 0o755)
    # Every try, not only the first: the old code started here, and the
    # attacker's symlink got the file chmod'ed within some tens of tries.
    ups = race(d, user, expect_start=False)
    check(ups == 0, f"memtallyd started {ups} times in {d}")


def test_sticky_dir_race():
    user = second_user()
    d = tempfile.mkdtemp(prefix="mt-it-sticky-")
    os.chmod(d, 0o1777)
    ups = race(d, user, expect_start=True)
    # It can only plant its symlink while no socket is there: most starts
    # come up, and each was checked.
    check(ups >= TRIES // 2, f"memtallyd came up only {ups} times")


def refused_link(sock, link, owner):
    """memtallyd on `sock` exits 2 with one line naming symlink `link`
    and its owner's uid."""
    p = Daemon(sock)
    up = p.settle()
    rc = p.stop()
    out = p.text()
    check(not up and rc == 2, f"started, or exit {rc}, for {sock}: {out}")
    lines = [ln for ln in out.splitlines() if "unsafe" in ln]
    check(len(lines) == 1 and
          f"symlink {link} is owned by uid {owner}," in lines[0],
          f"no line naming {link} (uid {owner}): {out}")
    check(not os.path.lexists(sock), f"{sock} made anyway")


def test_symlinks_on_the_path():
    base = tempfile.mkdtemp(prefix="mt-it-links-")
    os.chmod(base, 0o755)
    real = os.path.join(base, "real")      # root's, 0755: a fine place
    os.mkdir(real, 0o755)

    # Nobody's symlink to root's directory, in root's directory.
    link = os.path.join(base, "nobodys")
    os.symlink(real, link)
    os.lchown(link, NOBODY, NOGROUP)
    refused_link(os.path.join(link, "mt.sock"), link, NOBODY)

    # One nobody made in a sticky directory anyone may write (like /tmp),
    # where only nobody can replace it.
    sticky = os.path.join(base, "sticky")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    made = os.path.join(sticky, "run")
    r = subprocess.run(["ln", "-s", real, made], preexec_fn=as_user(
        (NOBODY, NOGROUP)), capture_output=True, text=True)
    check(r.returncode == 0 and os.lstat(made).st_uid == NOBODY,
          f"nobody's ln -s: {r.returncode} {r.stderr}")
    refused_link(os.path.join(made, "mt.sock"), made, NOBODY)

    # Second in a chain of links: root's (relative) link to nobody's.
    chain = os.path.join(base, "chain")
    os.symlink("nobodys", chain)
    refused_link(os.path.join(chain, "mt.sock"), link, NOBODY)

    # Root's link, in a directory nobody owns: nobody can replace the
    # link, so that directory is refused, though the socket's real
    # directory is root's.
    theirs = os.path.join(base, "theirs")
    os.mkdir(theirs, 0o755)
    os.chown(theirs, NOBODY, NOGROUP)
    os.symlink(real, os.path.join(theirs, "run"))
    refused(os.path.join(theirs, "run", "mt.sock"), theirs)

    # Root's links in root's directories (/run -> /var/run): accepted,
    # relative or absolute.
    os.symlink(real, os.path.join(base, "roots"))
    accepted(os.path.join(base, "roots", "mt.sock"))
    os.symlink("real", os.path.join(base, "roots-rel"))
    accepted(os.path.join(base, "roots-rel", "mt.sock"))


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("SKIP: needs root (other users, chown)")
        sys.exit(77)
    run([test_unsafe_dirs_refused, test_attacker_dir_race,
         test_sticky_dir_race, test_symlinks_on_the_path])
