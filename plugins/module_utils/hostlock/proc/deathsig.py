"""prctl(2): a child that dies with its parent (PR_SET_PDEATHSIG), and a parent that adopts its orphans.

A job forked under a lock must not go on once the process holding the lock is gone: the kernel sends the child
a chosen signal when its parent dies, which no SIGKILL of the parent can skip. The one race left, the parent
dying between fork() and the prctl, is closed by looking at getppid() after it (die_with_parent).
"""

from __future__ import annotations

import posix

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl_function() -> Callable[..., int] | None:
    """libc's prctl(2) as a callable, or None. Made before the fork, by hostlock: imported in the job's process,
    _ctypes would cost it ~1 ms of copy-on-write faults (twice the import's own time), taken from etcd's CPU
    on a machine with few cores while a fleet lock's requests are on their way.

    `_ctypes` directly: `import ctypes` costs ~4 ms more.
    """
    try:
        import _ctypes

        class _Int(_ctypes._SimpleCData):
            _type_ = "i"

        class _Func(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = _Int

        class _Self:
            _handle = _ctypes.dlopen(None)  # type: ignore[arg-type] # dlopen(NULL): the main program; typeshed wants a path

        return _Func(("prctl", _Self()))  # type: ignore[arg-type] # CFuncPtr reads only _handle: no CDLL needed
    except Exception:
        pass
    try:  # the documented way, should the private one ever change
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return None


def die_with_parent(prctl: Callable[..., int] | None, parent: int, sig: int, code: int) -> None:
    """In a forked child: get `sig` when our parent dies (nothing where prctl is None), and _exit(code) now if
    `parent` died already, between the fork and this call (we were orphaned: nobody holds the lock for us)."""
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if posix.getppid() != parent:
        posix._exit(code)


def become_subreaper(prctl: Callable[..., int] | None) -> bool:
    """Adopt our descendants when their parent dies (Linux 3.4+), so that an interrupted job's children can be
    waited for before the lock is released. False where prctl is missing or refuses."""
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


_dying_with: list = []  # the pid whose later children die with it (die_with_this_process), once


def die_with_this_process() -> bool:
    """Every child this process forks from now on is SIGKILLed when this process dies (PR_SET_PDEATHSIG),
    and one forked just as it died ends at once; their own children are left alone. False where prctl(2)
    is missing. ansible-playbook's workers (the serialize callback): SIGKILLed, it cannot end them itself,
    and a worker that went on (a slow lookup, a transfer) would start its task on a host the next run was
    told is free."""
    if _dying_with:
        return True
    prctl = prctl_function()
    if prctl is None or not hasattr(posix, "register_at_fork"):
        return False
    parent = posix.getpid()
    _dying_with.append(parent)
    direct = [True]  # False in a child's own children: the hook, inherited, must not touch them

    def hook() -> None:
        if not direct[0]:
            return
        direct[0] = False
        die_with_parent(prctl, parent, 9, 70)

    posix.register_at_fork(after_in_child=hook)
    return True
