"""`hostlock flock` side by side with util-linux flock(1): the same command line, exit codes, streams and
kernel lock, so each excludes the other and `alias flock='hostlock flock'` keeps a correct script working.

Every case in CASES and CONFLICTS runs with both tools; docs/cli.md's flock table is generated from these
lists by tools/flock_table.py (test_docs_table_is_current keeps it from drifting). Synchronisation is by
events: a holder prints a line once it holds the lock and holds it until its stdin is closed.
"""

import errno
import fcntl
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cli_support import pid_alive, wait_until

ROOT = Path(__file__).resolve().parents[3]
FLOCK = shutil.which("flock")
pytestmark = pytest.mark.skipif(FLOCK is None, reason="util-linux flock(1) is not installed")

TOOLS = ("flock", "hostlock")

# (id, arguments, expected exit code, output streams used: "" / "out" / "err" / "out+err", what it shows).
# FILE is a fresh lock file, DIR a directory, BADDIR a path whose directory does not exist.
CASES = [
    ("no-arguments", [], 64, "err", "usage error"),
    ("file-alone", ["FILE"], 64, "err", "a lone operand must be a descriptor number"),
    ("fd-not-open", ["99"], 65, "err", "flock(2) on a closed descriptor"),
    ("fd-not-a-number", ["abc"], 64, "err", "bad file descriptor"),
    ("no-fork-and-close", ["-o", "-F", "FILE", "true"], 64, "err", "-o with -F"),
    ("c-without-command", ["FILE", "-c"], 64, "err", "-c needs one argument"),
    ("c-with-two-words", ["FILE", "-c", "true", "extra"], 64, "err", "-c takes exactly one"),
    ("c-before-file", ["-c", "true", "FILE"], 64, "err", "-c is only recognised after the file"),
    ("unknown-option", ["--bogus", "FILE", "true"], 64, "err", "unknown long option"),
    ("question-mark", ["-?"], 64, "err", "-? is a usage error"),
    ("ambiguous-abbreviation", ["--ver", "FILE", "true"], 64, "err", "--verbose or --version"),
    ("bad-wait", ["-w", "abc", "FILE", "true"], 64, "err", "invalid timeout"),
    ("negative-wait", ["-w", "-1", "FILE", "true"], 71, "err", "cannot set up timer"),
    ("bad-conflict-code", ["-E", "abc", "FILE", "true"], 64, "err", "invalid exit code"),
    ("conflict-code-range", ["-E", "256", "FILE", "true"], 64, "err", "exit code out of range"),
    ("help", ["-h"], 0, "out", "usage on stdout"),
    ("version", ["-V"], 0, "out", "version on stdout"),
    ("cannot-open", ["BADDIR/lock", "true"], 66, "err", "cannot open lock file"),
    ("cannot-execute", ["FILE", "BADDIR/cmd"], 69, "err", "failed to execute"),
    ("command-status", ["FILE", "sh", "-c", "exit 7"], 7, "", "the command's exit status"),
    ("command-signal", ["FILE", "sh", "-c", "kill -TERM $$"], 143, "", "128+N for signal N"),
    ("shell-command", ["FILE", "-c", "exit 3"], 3, "", "-c through $SHELL"),
    ("long-command", ["FILE", "--command", "echo hi"], 0, "out", "--command spelling"),
    ("directory", ["DIR", "true"], 0, "", "a directory is opened read-only and locked"),
    ("shared", ["-s", "FILE", "true"], 0, "", "shared lock"),
    ("exclusive-e", ["-e", "FILE", "true"], 0, "", "-e is -x"),
    ("unlock-file", ["-u", "FILE", "true"], 0, "", "-u on a file: nothing to unlock, runs the command"),
    ("nonblocking-free", ["--nb", "FILE", "true"], 0, "", "--nb on a free lock"),
    ("man-nonblock", ["--nonblock", "FILE", "true"], 0, "", "the man page's --nonblock, a prefix of --nonblocking"),
    ("wait-leading-dot", ["-w", ".007", "DIR", "-c", "true"], 0, "", "the man page's '-w .007 /tmp -c ...'"),
    ("wait-free", ["--timeout", "1.5", "FILE", "true"], 0, "", "--timeout is a wait, fractions allowed"),
    ("verbose", ["--verbose", "FILE", "true"], 0, "out", "--verbose chatter goes to stdout"),
    ("dash-dash", ["--", "FILE", "true"], 0, "", "'--' ends the options"),
    ("script-without-shebang", ["FILE", "SCRIPT", "a"], 0, "out", "a file without #! runs through /bin/sh (execvp(3))"),
    ("no-fork-script-without-shebang", ["-F", "FILE", "SCRIPT"], 0, "out", "the same with -F"),
    ("empty-command-name", ["FILE", ""], 69, "err", "an empty command name: failed to execute"),
    ("no-fork-empty-command-name", ["-F", "FILE", ""], 69, "err", "the same with -F"),
    ("wait-past-the-timer", ["-w", "1e10", "FILE", "true"], 0, "", "a wait longer than any timer waits without end"),
    ("wait-near-time_t-end", ["-w", "1e18", "FILE", "true"], 0, "", "still a wait without end"),
    ("wait-past-time_t", ["-w", "1e19", "FILE", "true"], 71, "err", "no timer past time_t: cannot set up timer"),
    ("wait-infinite", ["-w", "inf", "FILE", "true"], 71, "err", "nor for inf"),
    ("wait-nan", ["-w", "nan", "FILE", "true"], 71, "err", "nor for nan"),
    ("wait-hex", ["-w", "0x1p-3", "FILE", "true"], 0, "", "strtod's hex floats"),
    ("wait-leading-space", ["-w", " 1", "FILE", "true"], 0, "", "strtod skips leading space"),
    ("wait-trailing-space", ["-w", "1 ", "FILE", "true"], 64, "err", "but not trailing space"),
    ("wait-underscore", ["-w", "1_0", "FILE", "true"], 64, "err", "no '_' between digits (Python's float takes it)"),
    ("wait-non-ascii-digit", ["-w", "\u0665", "FILE", "true"], 64, "err", "no digits but ASCII ones"),
    ("conflict-code-underscore", ["-E", "1_0", "FILE", "true"], 64, "err", "invalid exit code"),
    ("conflict-code-trailing-space", ["-E", "5 ", "FILE", "true"], 64, "err", "invalid exit code"),
    ("conflict-code-overflow", ["-E", "99999999999999999999", "FILE", "true"], 64, "err", "out of range"),
    ("fd-trailing-space", ["9 "], 64, "err", "bad file descriptor"),
    ("fd-underscore", ["1_0"], 64, "err", "bad file descriptor (not fd 10)"),
    ("fd-overflow", ["2147483648"], 64, "err", "numerical result out of range"),
]

# Cases whose every word must match flock(1)'s too (stdout, and stderr after the program's name).
_SAME_WORDS_PREFIXES = ("script-", "no-fork-script", "empty-", "no-fork-empty", "wait-", "conflict-code-", "fd-",
                        "cannot-execute", "negative-wait", "bad-wait")
SAME_WORDS = [c[0] for c in CASES if c[0].startswith(_SAME_WORDS_PREFIXES)]

# (id, holder's options, contender's options, contender's expected exit code, streams of the contender).
CONFLICTS = [
    ("nonblock", ["-x"], ["-n"], 1, "", "exit 1 on conflict, silently"),
    ("nonblock-E", ["-x"], ["-n", "-E", "42"], 42, "", "-E sets the conflict code"),
    ("wait-expires", ["-x"], ["-w", "0.3"], 1, "", "-w: a wait that expires is a conflict"),
    ("wait-zero", ["-x"], ["-w", "0"], 1, "", "-w 0 is -n"),
    ("verbose-conflict", ["-x"], ["-n", "--verbose"], 1, "err", "--verbose: 'failed to get lock' on stderr"),
    ("shared-shared", ["-s"], ["-s", "-n"], 0, "", "shared locks coexist"),
    ("shared-exclusive", ["-s"], ["-n"], 1, "", "shared excludes exclusive"),
    ("exclusive-shared", ["-x"], ["-s", "-n"], 1, "", "exclusive excludes shared"),
]


def _streams(r) -> str:
    return "+".join(s for s, text in (("out", r.stdout), ("err", r.stderr)) if text)


class Side:
    """Runs flock(1) or `hostlock flock` with the same words."""

    def __init__(self, tool: str, launcher: Path, tmp: Path):
        self.tool = tool
        self.base = [FLOCK] if tool == "flock" else [str(launcher), "flock"]
        self.tmp = tmp
        self.env = dict(os.environ, SHELL="/bin/sh")
        self.env.pop("PYTHONPATH", None)

    def words(self, args):
        sub = {"FILE": str(self.tmp / "lock"), "DIR": str(self.tmp), "BADDIR": str(self.tmp / "missing"),
               "SCRIPT": str(self.tmp / "script")}
        out = []
        for a in args:
            for k, v in sub.items():
                if a == k or a.startswith(k + "/"):
                    a = v + a[len(k):]
                    break
            out.append(a)
        return self.base + out

    def run(self, args, **kw):
        return subprocess.run(self.words(args), capture_output=True, text=True, timeout=60, check=False,
                              env=self.env, **kw)

    def hold(self, options, path=None, procs=None):
        """Hold the lock until the returned process's stdin closes; returns once it is held."""
        argv = self.words(options) + [str(path or self.tmp / "lock"), "sh", "-c", "echo held; exec cat >/dev/null"]
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env)
        if procs is not None:
            procs.append(p)
        assert p.stdout.readline() == "held\n"
        return p


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def _script(tmp: Path) -> None:
    """SCRIPT: an executable without #!, which execvp(3) hands to /bin/sh."""
    script = tmp / "script"
    script.write_text('echo "no #! ran as $0 with $#"\n')
    script.chmod(0o755)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_exit_code_and_streams(case, launcher, tmp_path):
    """flock(1) and hostlock flock agree on the exit code and on which streams they write to, and where
    flock(1)'s words are the contract (SAME_WORDS), on every word after the program's name."""
    _id, args, code, streams, _what = case
    _script(tmp_path)
    said = {}
    for tool in TOOLS:
        side = Side(tool, launcher, tmp_path)
        r = side.run(args)
        assert (r.returncode, _streams(r)) == (code, streams), (tool, r.stdout, r.stderr)
        prefix = "flock: " if tool == "flock" else "hostlock flock: "
        if tool == "hostlock":  # docs/cli.md: every message starts so (a `grep 'flock: '` still matches)
            assert all(line.startswith(prefix) for line in r.stderr.splitlines()), r.stderr
        said[tool] = (r.stdout, [line[len(prefix):] if line.startswith(prefix) else line
                                 for line in r.stderr.splitlines()])
    if _id in SAME_WORDS:
        assert said["hostlock"] == said["flock"]


@pytest.mark.parametrize("holder", TOOLS)
@pytest.mark.parametrize("contender", TOOLS)
@pytest.mark.parametrize("case", CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_conflicts_both_directions(case, holder, contender, launcher, tmp_path, procs):
    """Each tool excludes (or shares with) the other exactly as flock(1) does with itself."""
    _id, hold_opts, opts, code, streams, _what = case
    h = Side(holder, launcher, tmp_path).hold(hold_opts, procs=procs)
    r = Side(contender, launcher, tmp_path).run(opts + ["FILE", "true"])
    assert (r.returncode, _streams(r)) == (code, streams), r.stderr
    h.stdin.close()
    assert h.wait(timeout=30) == 0
    # and once the holder is gone, the lock is free for the other tool
    assert Side(contender, launcher, tmp_path).run(["-n", "FILE", "true"]).returncode == 0


def _bash(script: str, launcher: Path, tool: str, tmp: Path, **kw):
    """Run a bash script in which `flock` is the tool under test (an alias, as users would set it)."""
    alias = "" if tool == "flock" else "shopt -s expand_aliases\nalias flock=%s\n" % repr(f"{launcher} flock")
    return subprocess.Popen(["bash", "-c", alias + script], cwd=tmp, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.mark.parametrize("tool", TOOLS)
def test_fd_form_in_a_subshell(tool, launcher, tmp_path, procs):
    """`( flock -n 9 || exit 1; ... ) 9>f`: the shell's descriptor holds the lock; a second copy exits 1."""
    script = '( flock -n 9 || exit 1; echo held; cat >/dev/null ) 9>lock'
    first = _bash(script, launcher, tool, tmp_path)
    procs.append(first)
    assert first.stdout.readline() == "held\n"
    for other in TOOLS:
        second = _bash(script, launcher, other, tmp_path)
        out, _err = second.communicate(timeout=60)
        assert (second.returncode, out) == (1, "")
    first.stdin.close()
    assert first.wait(timeout=30) == 0


@pytest.mark.parametrize("tool", TOOLS)
def test_fd_form_exec_and_unlock(tool, launcher, tmp_path, procs):
    """`exec 9>f; flock 9` locks for the rest of the shell; `flock -u 9` gives it back."""
    script = 'exec 9>lock; flock 9; echo held; read x; flock -u 9; echo unlocked; cat >/dev/null'
    p = _bash(script, launcher, tool, tmp_path)
    procs.append(p)
    assert p.stdout.readline() == "held\n"
    for other in TOOLS:
        assert Side(other, launcher, tmp_path).run(["-n", "FILE", "true"]).returncode == 1
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline() == "unlocked\n"
    for other in TOOLS:
        assert Side(other, launcher, tmp_path).run(["-n", "FILE", "true"]).returncode == 0
    p.stdin.close()
    assert p.wait(timeout=30) == 0


@pytest.mark.parametrize("close", [False, True], ids=["inherit", "close"])
def test_close_decides_whether_the_command_keeps_the_descriptor(close, launcher, tmp_path):
    """Without -o the command inherits the lock's descriptor (a background child keeps the lock after the
    wrapper exits); with -o it does not. Both tools the same."""
    seen = {}
    for tool in TOOLS:
        side = Side(tool, launcher, tmp_path)
        # The background child closes its stdout (so run() returns) and holds until the gate file appears.
        gate = tmp_path / f"gate-{tool}"
        job = f"(exec >/dev/null 2>&1; while [ ! -e {gate} ]; do sleep 0.05; done) & echo $!"
        r = side.run((["-o"] if close else []) + ["FILE", "sh", "-c", job])
        assert r.returncode == 0, r.stderr
        child = int(r.stdout)
        try:
            seen[tool] = [Side(t, launcher, tmp_path).run(["-n", "FILE", "true"]).returncode for t in TOOLS]
        finally:
            gate.touch()
            wait_until(lambda pid=child: not pid_alive(pid), what="background child to end")
    assert seen["flock"] == seen["hostlock"] == ([0, 0] if close else [1, 1])


@pytest.mark.parametrize("tool", TOOLS)
def test_no_fork_execs_in_place(tool, launcher, tmp_path):
    """-F: the command replaces the wrapper (same pid) and holds the lock itself."""
    side = Side(tool, launcher, tmp_path)
    p = subprocess.Popen(side.words(["-F", "FILE", "sh", "-c", "echo $$; exec cat >/dev/null"]),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=side.env)
    try:
        assert int(p.stdout.readline()) == p.pid
        assert Side("flock", launcher, tmp_path).run(["-n", "FILE", "true"]).returncode == 1
    finally:
        p.stdin.close()
        assert p.wait(timeout=30) == 0


@pytest.mark.parametrize("no_fork", [[], ["-F"]], ids=["fork", "no-fork"])
def test_command_gets_default_sigpipe(no_fork, launcher, tmp_path):
    """The command dies of SIGPIPE when its reader goes (Python ignores SIGPIPE; the command must not)."""
    codes = []
    for tool in TOOLS:
        side = Side(tool, launcher, tmp_path)
        r = subprocess.run(["bash", "-c", '"$@" | head -c1 >/dev/null; echo "${PIPESTATUS[0]}"', "-",
                            *side.words(no_fork + ["FILE", "yes"])], capture_output=True, text=True, check=True,
                           timeout=60, env=side.env)
        codes.append(r.stdout.strip())
    assert codes == ["141", "141"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_read_only_file_system_is_73(launcher, tmp_path):
    """Creating the lock file on a read-only mount (a private tmpfs in its own mount namespace): 73."""
    ro = tmp_path / "ro"
    ro.mkdir()
    for tool in TOOLS:
        side = Side(tool, launcher, tmp_path)
        cmd = "mount -t tmpfs -o ro tmpfs %s && exec \"$@\"" % ro
        r = subprocess.run(["unshare", "-m", "sh", "-c", cmd, "-", *side.words([str(ro / "x"), "true"])],
                           capture_output=True, text=True, timeout=60, check=False, env=side.env)
        assert (r.returncode, _streams(r)) == (73, "err"), (tool, r.stderr)


def test_shell_is_taken_from_SHELL(launcher, tmp_path):
    """-c runs through $SHELL as flock(1) does (docs/cli.md used to say /bin/sh)."""
    fake = tmp_path / "fakeshell"
    fake.write_text('#!/bin/sh\necho "fakeshell $*"\n')
    fake.chmod(0o755)
    outs = []
    for tool in TOOLS:
        side = Side(tool, launcher, tmp_path)
        side.env["SHELL"] = str(fake)
        outs.append(side.run(["FILE", "-c", "echo x"]).stdout)
    assert outs[0] == outs[1] == "fakeshell -c echo x\n"


def test_lock_the_script_itself(launcher, tmp_path, procs):
    """The man page's idiom, with `flock` on PATH being hostlock: a second copy exits 1 while one runs."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "flock"
    wrapper.write_text(f'#!/bin/sh\nexec {launcher} flock "$@"\n')
    wrapper.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/bash\n[ "${FLOCKER}" != "$0" ] && exec env FLOCKER="$0" flock -en "$0" "$0" "$@" || :\n'
                      'echo running; cat >/dev/null\n')
    script.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    env.pop("FLOCKER", None)
    first = subprocess.Popen([str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    procs.append(first)
    assert first.stdout.readline() == "running\n"
    second = subprocess.run([str(script)], stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                            timeout=60, check=False)
    assert (second.returncode, second.stdout) == (1, "")
    # the real flock(1) is excluded by the script's hostlock too
    assert subprocess.run([FLOCK, "-n", str(script), "true"], check=False).returncode == 1
    first.stdin.close()
    assert first.wait(timeout=30) == 0


# ------------------------------------------------------------------------------------------- --fcntl


def _ofd(path: Path, kind: int, start: int = 0, length: int = 0):
    """Take an OFD lock the way any other program would; returns the fd or None on conflict."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.fcntl(fd, 37, struct.pack("hhqqi", kind, os.SEEK_SET, start, length, 0))  # F_OFD_SETLK
    except OSError as exc:
        os.close(fd)
        assert exc.errno in (errno.EAGAIN, errno.EACCES)
        return None
    return fd


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OFD locks are Linux-only")
def test_fcntl_takes_ofd_locks(launcher, tmp_path, procs):
    """--fcntl, --start, --length: OFD fcntl locks, which exclude other OFD lockers of the same bytes and
    are independent of flock(2) locks (as with flock(1) --fcntl, in util-linux releases newer than 2.38)."""
    side = Side("hostlock", launcher, tmp_path)
    lock = tmp_path / "lock"
    h = side.hold(["--fcntl"], procs=procs)
    assert _ofd(lock, fcntl.F_RDLCK) is None  # another program's OFD lock is excluded
    assert side.run(["--fcntl", "-n", "FILE", "true"]).returncode == 1
    assert Side("flock", launcher, tmp_path).run(["-n", "FILE", "true"]).returncode == 0  # flock(2): independent
    h.stdin.close()
    assert h.wait(timeout=30) == 0
    fd = _ofd(lock, fcntl.F_WRLCK, 100, 10)
    try:
        assert side.run(["--start", "100", "--length", "1", "-n", "FILE", "true"]).returncode == 1
        assert side.run(["--start", "110", "--length", "10", "-n", "FILE", "true"]).returncode == 0
        assert side.run(["--fcntl", "-s", "-n", "FILE", "true"]).returncode == 1  # whole file overlaps
    finally:
        os.close(fd)
    assert side.run(["--start", "1K", "--length", "1KiB", "-n", "FILE", "true"]).returncode == 0
    assert side.run(["--start", "x", "FILE", "true"]).returncode == 64


# ------------------------------------------------------------------------------------- hostlock's own


def test_signals_reach_the_command(launcher, tmp_path, procs):
    """SIGTERM to hostlock flock reaches the command, which ends and frees the lock; hostlock exits with
    its status. (flock(1) dies and leaves the command running with the lock: see docs/cli.md.)"""
    job = ("import signal, sys\n"
           "def term(*_):\n    print('got TERM', flush=True)\n    sys.exit(3)\n"
           "signal.signal(signal.SIGTERM, term)\nprint('held', flush=True)\nwhile True:\n    signal.pause()\n")
    side = Side("hostlock", launcher, tmp_path)
    p = subprocess.Popen(side.words(["FILE", sys.executable, "-c", job]), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=side.env)
    procs.append(p)
    assert p.stdout.readline() == "held\n"
    p.send_signal(signal.SIGTERM)
    assert p.stdout.readline() == "got TERM\n"
    assert p.wait(timeout=30) == 3
    assert Side("flock", launcher, tmp_path).run(["-n", "FILE", "true"]).returncode == 0


def test_command_dies_with_hostlock(launcher, tmp_path, procs):
    """SIGKILL to hostlock flock ends the command too (PR_SET_PDEATHSIG), so nothing runs on unlocked."""
    side = Side("hostlock", launcher, tmp_path)
    p = subprocess.Popen(side.words(["-o", "FILE", "sh", "-c", "echo $$; exec cat"]), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=side.env)
    procs.append(p)
    job = int(p.stdout.readline())
    p.kill()
    p.wait(timeout=30)
    wait_until(lambda: not pid_alive(job), what="the job to die with hostlock")
    assert Side("flock", launcher, tmp_path).run(["-n", "FILE", "true"]).returncode == 0


def _children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return kids


@pytest.mark.parametrize("mode", ["same", "new"])
def test_process_group_decides_whether_grandchildren_die_with_hostlock(mode, launcher, tmp_path, procs):
    """SIGKILL to `hostlock flock -o`: by default (as with flock(1)) a grandchild of the command runs on,
    unlocked; with --process-group new the command's whole group dies with hostlock."""
    side = Side("hostlock", launcher, tmp_path)
    gate = tmp_path / "gate"
    p = subprocess.Popen(side.words(["--process-group", mode, "-o", "FILE", "sh", "-c",
                                     f"(while [ ! -e {gate} ]; do sleep 0.05; done) & echo $!; wait"]),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=side.env)
    procs.append(p)
    grandchild = int(p.stdout.readline())
    if mode == "new":
        # The job runs only once its watcher knows it (the supervisor's gate), so both exist by now; seen
        # from here too, so a failure below cannot be a kill that came before the watcher.
        wait_until(lambda: len(_children(p.pid)) == 2, what="hostlock's job and watcher")
    p.kill()
    p.wait(timeout=30)
    try:
        if mode == "new":
            wait_until(lambda: not pid_alive(grandchild), what="the job's group to die with hostlock")
        else:
            assert pid_alive(grandchild)
            assert Side("flock", launcher, tmp_path).run(["-n", "FILE", "true"]).returncode == 0  # unlocked
    finally:
        gate.touch()
        wait_until(lambda: not pid_alive(grandchild), what="the grandchild to end")


@pytest.mark.parametrize("close", [[], ["-o"]], ids=["inherit", "close"])
def test_lock_is_free_when_hostlock_exits_with_a_watcher(close, launcher, tmp_path):
    """With --process-group new hostlock has a watcher process; it never holds the lock past hostlock's
    exit, so the next flock -n right after succeeds (repeated: the window would be short)."""
    side = Side("hostlock", launcher, tmp_path)
    other = Side("flock", launcher, tmp_path)
    for _round in range(10):
        assert side.run(["--process-group", "new", *close, "FILE", "true"]).returncode == 0
        assert other.run(["-n", "FILE", "true"]).returncode == 0


def test_fifo_at_the_lock_path_is_refused(launcher, tmp_path):
    """flock(1) would block forever opening a FIFO; hostlock flock refuses it (exit 66, one line)."""
    os.mkfifo(tmp_path / "lock")
    r = Side("hostlock", launcher, tmp_path).run(["-n", "FILE", "true"])
    assert r.returncode == 66
    assert "FIFO" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to give the symlink to another user)")
def test_symlink_planted_by_another_user_in_sticky_dir_is_refused(launcher, tmp_path):
    """In a sticky world-writable directory, a symlink owned by another user is not followed (exit 66, the
    target is neither created nor locked); our own symlink is followed like flock(1) follows it."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    target = tmp_path / "target"
    os.symlink(target, sticky / "lock")
    os.lchown(sticky / "lock", 65534, 65534)  # as if user nobody had planted it
    side = Side("hostlock", launcher, sticky)
    r = side.run(["FILE", "true"])
    assert r.returncode == 66 and "symlink owned by uid 65534" in r.stderr and r.stderr.count("\n") == 1
    assert not target.exists()
    os.unlink(sticky / "lock")
    os.symlink(target, sticky / "lock")
    assert side.run(["FILE", "true"]).returncode == 0
    assert target.exists()


def test_another_users_file_in_a_sticky_directory_is_refused(launcher, tmp_path):
    """Another user's regular file in a sticky directory others can write (/tmp): its owner may remove it and
    create another while we hold this one, and the next locker then locks that one beside us (two holders;
    util-linux flock(1) too, where fs.protected_regular is 0). Refused, exit 66, one line; our own file and
    one of the directory's owner are locked as ever."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "lock").write_text("")
    os.chown(sticky / "lock", 65534, 65534)  # as if user nobody had made it first
    side = Side("hostlock", launcher, sticky)
    r = side.run(["FILE", "true"])
    try:
        protected = Path("/proc/sys/fs/protected_regular").read_text().strip() != "0"
    except OSError:
        protected = False
    # Where fs.protected_regular is set the kernel refuses the open itself (EACCES), as it does flock(1)'s.
    said = "belongs to uid 65534, in a sticky directory" in r.stderr or (protected and "ermission denied" in r.stderr)
    assert r.returncode == 66 and said and r.stderr.count("\n") == 1, r
    os.chown(sticky / "lock", 0, 0)
    assert side.run(["FILE", "true"]).returncode == 0
    private = tmp_path / "private"  # not sticky, not writable by others: its files' owners are trusted as ever
    private.mkdir()
    (private / "lock").write_text("")
    os.chown(private / "lock", 65534, 65534)
    assert Side("hostlock", launcher, private).run(["FILE", "true"]).returncode == 0


@pytest.mark.parametrize("layout", ["world-writable", "another-users", "group-root-is-not-in", "root-link-into-it"])
def test_root_refuses_a_file_in_a_directory_another_user_can_change(layout, launcher, tmp_path):
    """A directory where someone but root may remove and re-create the file (without a sticky bit that stops
    them): while root holds the lock on one inode, the next root locker would lock the new one, beside it.
    Refused, exit 66, one line, the command not run, as for /tmp above; `run --path` opens the same way. A
    root link into such a directory is judged by where it leads."""
    d = tmp_path / "d"
    d.mkdir()
    path = d / "lock"
    if layout == "world-writable":
        d.chmod(0o777)
    elif layout == "another-users":
        os.chown(d, 65534, 65534)
    elif layout == "group-root-is-not-in":
        os.chown(d, 0, 65534)
        d.chmod(0o775)
    else:
        os.chown(d, 65534, 65534)
        path = tmp_path / "link"
        path.symlink_to(d / "lock")
    side = Side("hostlock", launcher, tmp_path)
    for words in (["flock", str(path)], ["run", "--path", str(path)]):
        r = subprocess.run([str(launcher), *words, "touch", str(tmp_path / "ran")], capture_output=True, text=True,
                           timeout=60, check=False, env=side.env)
        assert r.returncode == 66 and r.stderr.count("\n") == 1 and "two holders" in r.stderr, (words, r)
        assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("layout", ["root-0755", "root-sticky-own-file", "group-root", "nobody-in-its-own"])
def test_directories_nobody_else_can_change_are_locked_as_ever(layout, launcher, tmp_path):
    """The other side of the rule: root's own directories (group root may write: root is in it), its own file
    in a sticky directory, and another user in a directory of their own."""
    from engine_helpers import LIB, NOBODY

    top = Path(tempfile.mkdtemp(prefix="hostlock-flock-", dir="/tmp"))  # reachable by uid 65534, unlike tmp_path
    try:
        top.chmod(0o755)
        d = top / "d"
        d.mkdir()
        argv = [str(launcher), "flock", str(d / "lock"), "true"]
        if layout == "root-sticky-own-file":
            d.chmod(0o1777)
        elif layout == "group-root":
            d.chmod(0o775)
        elif layout == "nobody-in-its-own":
            os.chown(d, NOBODY, NOBODY)
            code = ("import sys; sys.path.insert(0, sys.argv[1]); from hostlock.cli import main; "
                    "sys.exit(main(sys.argv[2:]))")
            argv = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", "/usr/bin/python3",
                    "-I", "-c", code, LIB, "flock", str(d / "lock"), "true"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd="/")
        assert r.returncode == 0, r.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_lock_file_is_never_written(launcher, tmp_path):
    """Locking opens without O_TRUNC and writes nothing, with flock(2) or an exclusive --fcntl lock (which
    opens the file write-only, as flock(1) does)."""
    lock = tmp_path / "lock"
    lock.write_text("payload\n")
    for args in (["FILE", "true"], ["--fcntl", "FILE", "true"], ["-s", "--fcntl", "FILE", "true"]):
        assert Side("hostlock", launcher, tmp_path).run(args).returncode == 0
    assert lock.read_text() == "payload\n"


def test_docs_table_is_current():
    """docs/cli.md's flock table is what tools/flock_table.py makes from CASES and CONFLICTS."""
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "flock_table.py")], capture_output=True,
                          text=True, check=True).stdout
    assert made.strip() in (ROOT / "docs" / "cli.md").read_text(), "run tools/flock_table.py --write"


@pytest.mark.parametrize("tool,extra", [("flock", []), ("hostlock", []), ("hostlock", ["--process-group", "new"])],
                         ids=["flock", "hostlock", "hostlock-new-group"])
def test_sigint_to_the_callers_group_stops_the_calling_loop(tool, extra, launcher, tmp_path):
    """`kill -INT -- -PGID` of a script looping over flock (a supervisor, a test harness; not a terminal):
    flock(1) dies of the SIGINT, so bash stops the loop ("wait and cooperative exit"). hostlock forwards it,
    and once the command has died of it, dies of SIGINT too: exiting 130 would let the loop go on."""
    words = " ".join(extra)
    script = (f'for i in 1 2; do flock {words} lock sh -c "echo started \\$0; exec cat >/dev/null" $i; '
              'echo "ended $i rc=$?"; done; echo loop-finished')
    from engine_helpers import default_signals

    # SIGINT at its default in bash and its children, whatever the test process inherited (an ignored SIGINT
    # stays ignored across exec: nothing would die of it)
    p = _bash(script, launcher, tool, tmp_path, start_new_session=True, preexec_fn=default_signals)
    try:
        assert p.stdout.readline() == "started 1\n"
        os.killpg(p.pid, signal.SIGINT)
        # stdin stays open: `cat` ends only by the SIGINT (communicate() would close it, and a `cat` at EOF
        # before the forwarded signal landed exits 0, which rightly lets the loop go on); a loop that goes on
        # blocks in the next `cat` and times out here
        p.wait(timeout=60)
        out, err = p.stdout.read(), p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "started 2" not in out and "loop-finished" not in out, (out, err)
    assert p.returncode == -signal.SIGINT, (p.returncode, out, err)


@pytest.mark.parametrize("args", [["--verbose", "FILE", "sh", "-c", "touch ran"], ["-V"], ["-h"]],
                         ids=["verbose", "version", "help"])
def test_output_it_cannot_write_is_73_and_one_line_and_runs_nothing(args, launcher, tmp_path):
    """A full stdout (docs/cli.md's flock table): flock(1) runs the command and exits 1 ("write error");
    hostlock exits 73 at once with one line on stderr, so what it was told to say is never lost silently."""
    side = Side("hostlock", launcher, tmp_path)
    with open("/dev/full", "w") as full:
        r = subprocess.run(side.words(args), stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                           check=False, env=side.env, cwd=tmp_path)
    assert r.returncode == 73, r.stderr
    assert r.stderr.startswith("hostlock flock: ") and "No space left on device" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert not (tmp_path / "ran").exists()


def test_a_pipe_reached_through_proc_is_named_not_called_missing(launcher, tmp_path):
    """`echo x | flock /dev/stdin cmd`: /proc's magic link leads to `pipe:[N]`, no file. Refused like a FIFO
    (exit 66, one line that says it is a pipe), not "No such file or directory"; a file behind it still locks."""
    side = Side("hostlock", launcher, tmp_path)
    r = subprocess.run(side.words(["/dev/stdin", "cat"]), input="data\n", capture_output=True, text=True,
                       timeout=60, check=False, env=side.env)
    assert r.returncode == 66 and r.stdout == "", r
    assert "a pipe or socket, not a file" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    (tmp_path / "f").write_text("")
    with open(tmp_path / "f") as f:
        r = subprocess.run(side.words(["/dev/stdin", "true"]), stdin=f, capture_output=True, text=True, timeout=60,
                           check=False, env=side.env)
    assert r.returncode == 0, r.stderr
