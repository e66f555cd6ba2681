"""`run`/`cron --replace`: when the job's lock is busy, end the running copy and run instead of it (supercronic's
`-replacing`, Kubernetes' `concurrencyPolicy: Replace`). Loaded only when the lock was busy and --replace given.

What is ended, and how (docs/cli.md, docs/security.md):
- Only a holder the kernel proves, at that moment, to hold this lock (core.holder.Holder.prove(): alive with the
  recorded start time, its real uid the claimed one, the lock's range held), that runs a job (a `hostlock run`
  or `cron` holder: its record names the job's pid), and whose real uid is ours. Another user's job, root's
  included when we are not root and ours when we are root and it is not, a lease (`hostlock hold`), an Ansible
  task, a holder nobody can prove: never signalled; the run is then busy, as without --replace.
- With the time limit's kill sequence: SIGTERM (and SIGCONT) to the holder's hostlock, which forwards it to its
  job's process group; if it has not exited after --kill-after, SIGKILL to it (through a pidfd, proven again
  first), whose watcher then kills the job's whole tree before the lock is free (proc/jobkill.py). Then this run
  waits for the lock (up to SETTLE) like any waiter: those queued before it keep their turn. With --wait D the
  running copy first gets D to end on its own (without, none).
- Exclusive host locks only: a shared lock or a semaphore is meant to have several holders (which would be
  "the" copy?), and a fleet lock's holder may run on another host, where no kernel fact can be read.
"""

from __future__ import annotations

import os

from . import common as c

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from ..core.errors import LockTimeout
    from .options import Options, RunLock

# After the SIGKILL, how long the lock may take to come free: the dead holder's watcher freezes and kills the
# job's tree first (milliseconds, unless a process is stuck in the kernel).
SETTLE = 10.0


def _kill(holder: object) -> None:
    """SIGKILL `holder`'s process, if it still proves to be the holder (after its pidfd is open)."""
    import signal

    from ..core import procstat

    pid = holder.pid  # type: ignore[attr-defined]
    fd = procstat.pidfd(pid)
    try:
        if holder.prove() is not True:  # type: ignore[attr-defined]
            return
        sender = getattr(signal, "pidfd_send_signal", None)
        if fd is not None and sender is not None:
            sender(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def replace(o: Options, lock: RunLock, busy: LockTimeout) -> list:
    """End the running copies of the job that hold `lock` (see the module's docstring), then take the lock,
    waiting up to SETTLE for it. Returns the holders ended; raises LockTimeout (`busy`, or the new
    wait's) when nothing of ours could be ended or the lock was taken by another first."""
    from ..core.holder import end_holders

    holders = [h for h in (getattr(busy, "holders", None) or []) if not h.stale]
    me = os.getuid()
    mine = [h for h in holders if h.job_pid and h.uid == me and h.prove() is True]
    if not mine or len(mine) != len(holders):
        if o.verbose:
            c.say("--replace: not ending %s: only a running copy of your own job, proven to hold the lock, is "
                  "ended" % "; ".join(h.describe() for h in holders if h not in mine))
        raise busy
    if o.verbose:
        c.say("--replace: ending %s (SIGTERM, SIGKILL after %s)"
              % ("; ".join(h.describe() for h in mine), c.format_span(o.kill_after)))
    try:
        end_holders(mine, o.kill_after)  # SIGTERM + SIGCONT to each still proven, then waits up to kill_after
    except PermissionError:
        raise busy from None
    for h in mine:
        if h.prove() is True:
            if o.verbose:
                c.say("--replace: %s still holds the lock after %s: SIGKILL" % (h.describe(),
                                                                                c.format_span(o.kill_after)))
            _kill(h)
    lock.acquire(timeout=SETTLE)
    return mine
