"""_proclocks: /proc/locks lines, and holders found through fdinfo in a /proc laid out by the test."""

import os

from hostlock.host.proclocks import describe, locks_on, parse_line


def test_parse_line_kinds():
    """The /proc/locks line forms the parser reads (waiters have '->'); anything else is skipped."""
    lk = parse_line("12: -> OFDLCK ADVISORY  READ  -1 fe:01:4242 100 EOF")
    assert (lk.id, lk.kind, lk.mode, lk.pid, lk.dev, lk.inode, lk.start, lk.end, lk.waiting) == \
        (12, "ofd", "shared", -1, (0xFE, 1), 4242, 100, None, True)
    lk = parse_line("1: POSIX  ADVISORY  WRITE 77 08:02:9 0 9")
    assert (lk.kind, lk.mode, lk.end, lk.waiting) == ("posix", "exclusive", 9, False)
    for bad in ("garbage", "x: FLOCK ADVISORY WRITE 1 08:02:9 0 EOF", "1: FLOCK ADVISORY WRITE 1 0802 0 EOF", ""):
        assert parse_line(bad) is None


def _proc(tmp_path, target, lines, pids):
    """A /proc with `locks` and, per pid: cmdline, stat (ppid), fd/N -> target, fdinfo/N with lock lines."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "locks").write_text("".join(line + "\n" for line in lines))
    for pid, (ppid, argv, fds) in pids.items():
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "fdinfo").mkdir()
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (d / "stat").write_text(f"{pid} (x y) S {ppid} 1 1 0\n")
        for fd, locklines in fds.items():
            os.symlink(target, d / "fd" / str(fd))
            (d / "fdinfo" / str(fd)).write_text("pos:\t0\nflags:\t02\n" + "".join(f"lock:\t{x}\n" for x in locklines))
    return str(proc)


def test_holders_come_from_fdinfo_not_from_the_pid_in_proc_locks(tmp_path):
    target = tmp_path / "f"
    target.touch()
    st = os.stat(target)
    where = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    lines = [f"1: FLOCK  ADVISORY  WRITE 500 {where} 0 EOF",   # taken by 500, which exited
             f"2: OFDLCK ADVISORY  READ  -1 {where} 0 EOF",    # OFD: no pid at all
             f"3: POSIX  ADVISORY  WRITE 30 {where} 5 9",
             f"3: -> POSIX  ADVISORY  WRITE 31 {where} 5 9",   # a waiter
             "4: FLOCK  ADVISORY  WRITE 1 00:00:1 0 EOF"]      # another file
    pids = {
        10: (1, ["flock", str(target), "job"], {}),
        11: (10, ["job", "--x"], {3: [f"1: FLOCK  ADVISORY  WRITE 500 {where} 0 EOF"]}),  # inherited
        20: (1, ["python3", "ofd-holder"], {4: [f"7: OFDLCK ADVISORY  READ  -1 {where} 0 EOF"]}),
        30: (1, ["posix-holder"], {5: [f"1: POSIX  ADVISORY  WRITE 30 {where} 5 9"]}),
        31: (1, ["posix-waiter"], {5: []}),
    }
    locks = locks_on(st.st_dev, st.st_ino, proc=_proc(tmp_path, target, lines, pids))
    got = [(lk.kind, lk.mode, lk.waiting, [(h.pid, h.fd, h.cmdline) for h in lk.holders]) for lk in locks]
    assert got == [
        ("flock", "exclusive", False, [(11, 3, "job --x")]),
        ("ofd", "shared", False, [(20, 4, "python3 ofd-holder")]),
        ("posix", "exclusive", False, [(30, 5, "posix-holder")]),
        ("posix", "exclusive", True, [(31, None, "posix-waiter")]),
    ]
    assert "bytes 5-9 waited for by pid 31" in describe(locks[3])


def test_a_holder_we_cannot_see_is_not_guessed(tmp_path):
    target = tmp_path / "f"
    target.touch()
    st = os.stat(target)
    where = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    proc = _proc(tmp_path, target, [f"1: OFDLCK ADVISORY  WRITE -1 {where} 0 EOF"], {})
    [lk] = locks_on(st.st_dev, st.st_ino, proc=proc)
    assert lk.holders == []
    assert "an unknown process" in describe(lk)
