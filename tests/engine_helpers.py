"""Helpers shared by the engine tests (unit and integration): real child processes with hostlock importable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

# The checkout's library source (what the in-process tests import, through pytest.ini's pythonpath).
CHECKOUT_LIB = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "plugins", "module_utils"))


def readable_copy(src: str = CHECKOUT_LIB) -> str:
    """A copy of src/hostlock that every user can read and nobody but root can write; returns its parent.

    Child processes import hostlock from here, whoever they run as: the tests that act as another user
    (setpriv 65534) could not read a checkout in a private directory (a 0700 home, `mktemp -d`), and a copy
    for everyone keeps one import path for every child. Made once per test process, removed at its exit.
    """
    import atexit
    import shutil
    import tempfile

    top = tempfile.mkdtemp(prefix="hostlock-lib-", dir="/tmp")  # /tmp, not $TMPDIR: it may be private too
    atexit.register(shutil.rmtree, top, True)
    shutil.copytree(os.path.join(src, "hostlock"), os.path.join(top, "hostlock"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for here, _dirs, files in os.walk(top):  # modes set here: a private clone's umask may have made them 0600
        os.chmod(here, 0o755)
        for f in files:
            os.chmod(os.path.join(here, f), 0o644)
    return top


# The library for child interpreters, root's and other users' alike (those started with -I, no site and no
# PYTHONPATH, add it to sys.path themselves).
LIB = readable_copy()

MECHANISMS = ["ofd", "flock", "record"]


# The signals tests send to the processes they start (hostlock forwards them; ansible-playbook stops on them).
TEST_SIGNALS = ("HUP", "INT", "QUIT", "TERM", "USR1", "USR2", "ALRM", "PWR", "RTMIN+2", "RTMIN+3")


def signum(name: str) -> int:
    """A signal's number from its name as kill(1) takes it: TERM, SIGTERM, RTMIN+3."""
    name = name[3:] if name.startswith("SIG") else name
    if name.startswith("RTMIN"):
        return signal.SIGRTMIN + int(name[5:] or 0)
    return getattr(signal, "SIG" + name)


def default_signals() -> None:
    """preexec_fn: in a child about to exec, the signals tests send back to their default dispositions.

    Tests may run where some are ignored and inherited so: `nohup make test` (SIGHUP), a background job of a
    shell without job control, as CI runners and `make test &` start it (SIGINT, SIGQUIT). A shell started
    with a signal ignored cannot trap it, and Python leaves an ignored SIGINT ignored (no KeyboardInterrupt):
    the tests would test that environment, not hostlock or ansible-playbook.
    """
    import signal

    for name in TEST_SIGNALS:
        signal.signal(signum(name), signal.SIG_DFL)


@pytest.fixture
def lockdir(tmp_path):
    d = tmp_path / "locks"
    d.mkdir(mode=0o700)
    return str(d)


@pytest.fixture(params=MECHANISMS)
def mechdir(request, tmp_path):
    """A lock directory bound to one mechanism (the directory's marker fixes it for every process)."""
    import hostlock

    d = tmp_path / request.param
    d.mkdir(mode=0o700)
    hostlock.Lock("init", directory=str(d), mechanism=request.param).close()
    return str(d)


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = LIB + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn(code: str, *args: str, **kw) -> subprocess.Popen:
    """Start a real Python child running `code` (dedented) with hostlock importable."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_line(proc: subprocess.Popen, expected: str, timeout: float = 10.0) -> str:
    """Read the child's stdout until a line starting with `expected` (the child says it is ready)."""
    import select
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = select.select([proc.stdout], [], [], 0.1)[0]
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(expected):
                return line.strip()
    err = proc.stderr.read() if proc.poll() is not None else "(running)"
    raise AssertionError("child never printed %r; stderr: %s" % (expected, err))


ROOT = os.geteuid() == 0
SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by other users (a venv's interpreter may live under /root)
NOBODY = 65534


def _can_run_as_others() -> bool:
    import shutil

    return ROOT and all(shutil.which(t) for t in ("setpriv", "groupadd", "groupdel"))


needs_users = pytest.mark.skipif(not _can_run_as_others(), reason="needs root, setpriv, groupadd and groupdel")


@pytest.fixture
def shared_group():
    """A real group (groupadd, removed afterwards) and a 3770 directory of root's shared with it, as the cli
    role sets up /run/hostlock. Yields (directory, gid); `as_member(gid, argv)` runs argv as uid 65534 in
    that group and no other."""
    import grp
    import shutil
    import tempfile
    import uuid

    name = "hlt%s" % uuid.uuid4().hex[:12]
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    top = tempfile.mkdtemp(prefix="hostlock-shared-", dir="/tmp")
    try:
        gid = grp.getgrnam(name).gr_gid
        os.chmod(top, 0o755)  # the other user must be able to reach the shared directory
        shared = os.path.join(top, "shared")
        os.mkdir(shared)
        os.chown(shared, 0, gid)
        os.chmod(shared, 0o3770)
        yield shared, gid
    finally:
        shutil.rmtree(top, ignore_errors=True)
        subprocess.run(["groupdel", name], check=False, capture_output=True)


def as_member(gid: int, argv: list, **kw) -> subprocess.CompletedProcess:
    """Run argv as user nobody (65534) whose only group is `gid`: a real member of the shared group."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 30)
    return subprocess.run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % gid, "--groups=%d" % gid, *argv],
                          check=False, **kw)


# Code for a child holding `l` (a Lock in directory `d`): it makes its lease one that has ended, with the very
# facts hostlock judges that on (host.channel.lease_end): its own 0600 socket .lease-ID.sock, named in its
# record, listening, with a modification time in the past. (A record's `lease=` text proves nothing: anyone who
# may write the file can write it.) What a real lease holder that was stopped after its lease ran out shows.
ENDED_LEASE = r"""
def end_lease(l, d):
    import os, socket, time
    tid = os.urandom(6).hex()
    l.update_record(tid=tid, lease="%f" % (time.time() - 1))
    path = os.path.join(d, ".lease-%s.sock" % tid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    s.bind(path)
    os.umask(old)
    s.listen(64)
    t = time.time() - 1
    os.utime(path, (t, t), follow_symlinks=False)
    return s
"""


VICTIM = r"""
import os, signal, sys
got = []
for s in (signal.SIGTERM, signal.SIGCONT, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, lambda n, _f: got.append(n))
print("ready", os.getpid(), flush=True)
for line in sys.stdin:                    # held until told: one line asks for the signals seen so far
    print("signals", sorted(got), flush=True)
"""


def start_victim() -> subprocess.Popen:
    """A root process that must never be signalled: it records every catchable signal it gets and reports
    them when asked (a line on stdin); the kernel delivers a signal sent before the request first."""
    p = subprocess.Popen([sys.executable, "-c", VICTIM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("ready")
    return p


def victim_signals(p: subprocess.Popen) -> str:
    p.stdin.write("report\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


# Another user's listener at a path: counts the connections it accepts, answers each as told, and says how many
# it had when asked (a line on stdin).
SQUAT = textwrap.dedent(r"""
    import os, select, socket, sys
    path, how = sys.argv[1], sys.argv[2]
    if how == "holds-the-lock":
        sys.path.insert(0, sys.argv[3])
        import hostlock
        lock = hostlock.Lock(sys.argv[4], directory=os.path.dirname(path)).acquire(timeout=5)
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    os.chmod(path, 0o666)  # anyone may connect: the client must still not talk to it
    s.listen(8)
    print("ready", flush=True)
    seen = 0
    while True:
        r = select.select([s, sys.stdin], [], [])[0]
        if sys.stdin in r:
            sys.stdin.readline()
            print("seen", seen, flush=True)
            continue
        c = s.accept()[0]
        seen += 1
        if how == "answers-ok":
            c.sendall(b"OK 99999999999.000 " + b"0" * 64 + b"\n")
        elif how in ("answers-refused", "holds-the-lock"):
            c.sendall(b"ERR refused: the member's own words\n")
        if how != "silent":
            c.close()
""")


def squat(uid: int, gid: int, path: str, how: str, name: str = "") -> subprocess.Popen:
    p = subprocess.Popen(["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--groups=%d" % gid, SYSTEM_PYTHON,
                          "-c", SQUAT, path, how, LIB, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    wait_line(p, "ready")
    return p


def seen(p: subprocess.Popen) -> int:
    p.stdin.write("\n")
    p.stdin.flush()
    return int(wait_line(p, "seen").split()[1])


def holder_pid(name: str, directory: str) -> int:
    import hostlock

    (h,) = [h for h in hostlock.holders(name, directory) if h.alive]
    return h.pid


def kill_daemon(pid: int) -> None:
    """SIGKILL a process nobody here reaps (a lease holder) and wait until it is gone or a zombie."""
    import time

    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while os.path.exists("/proc/%d" % pid):  # the holder is a daemon nobody here reaps: wait for it to go
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                break
        assert time.monotonic() < deadline
        time.sleep(0.005)


# A process that takes NAME in DIR and holds it until told (a line on stdin); it says "held MECHANISM". With a third
# argument it writes that text as its owner record over its own (a forged record, for the trust tests).
HOLD = textwrap.dedent(r"""
    import os, sys, hostlock
    d, name = sys.argv[1], sys.argv[2]
    lock = hostlock.Lock(name, directory=d).acquire()
    if len(sys.argv) > 3:
        fd = os.open(os.path.join(d, name + ".lock"), os.O_RDWR)
        os.pwrite(fd, (sys.argv[3] + "\n").encode().ljust(1024, b"\0"), 4096)
    print("held", lock.mechanism, flush=True)
    sys.stdin.readline()
""")


def root_holder(shared: str, name: str) -> subprocess.Popen:
    """HOLD as this test's own user (root), once it holds."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, shared, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=LIB))
    wait_line(p, "held")
    return p


def end_holder(p: subprocess.Popen) -> None:
    """Tell a HOLD process to release and exit, and wait for it."""
    if p.poll() is None:
        p.stdin.write("\n")
        p.stdin.flush()
    p.wait(timeout=30)
