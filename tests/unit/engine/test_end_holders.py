"""core.holder.end_holders: which holders it reports ended (break's "removed"), whatever the exit races."""

from __future__ import annotations

import signal
import subprocess
import sys

import hostlock
from hostlock.core import holder as _holder


def test_a_holder_that_the_sigterm_ends_before_its_sigcont_counts_as_ended(lockdir, monkeypatch):
    """The holder may exit between the SIGTERM and the SIGCONT: the SIGCONT then finds no process, yet the
    holder was signalled and ended (break --force said "nothing to remove", 1 in 8 runs under load)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys, hostlock; l = hostlock.Lock('e', directory=sys.argv[1])"
                          ".acquire(); print('held', flush=True); sys.stdin.read()", lockdir],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        (h,) = hostlock.holders("e", lockdir)
        real = _holder._send

        def send(pid: int, fd: object, signum: int) -> None:
            if signum == signal.SIGCONT:
                p.wait(30)  # the SIGTERM has ended it: as if it exited before the SIGCONT
                raise ProcessLookupError(3, "No such process")
            real(pid, fd, signum)

        monkeypatch.setattr(_holder, "_send", send)
        assert [x.pid for x in _holder.end_holders([h], 5.0)] == [p.pid]
        assert p.returncode == -signal.SIGTERM
    finally:
        p.kill()
        p.wait()
