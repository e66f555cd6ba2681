"""What the engine does in a forked child, from one fork hook, and the fork that skips it.

A child of a process using hostlock must never unlock, renew or keep its parent's locks (filelock #634): each
part of the engine that holds descriptors, leases or threads names what a child drops (`in_child`), and one
hook registered with the interpreter runs those, in the order they were named.

The command's supervisor forks a process that only execs the job (or exits): `exec_fork()` skips that work in
it. Its exec closes every descriptor of the engine (all are close-on-exec) and ends every thread and lease copy
anyway, and each object the hooks touched would have copied one of hostlock's pages (copy-on-write): ~0.1 ms
of CPU a child, taken from etcd's and hostlock's two cores while a fleet lock's job starts.
"""

from __future__ import annotations

import _thread
import posix

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

_HOOKS: list = []
_exec_forker: int | None = None  # the thread forking with exec_fork(), while it does (its child runs no hook)


def in_child(hook: Callable[[], None]) -> None:
    """Run `hook` in every forked child of this process but exec_fork()'s."""
    _HOOKS.append(hook)


def _after_fork_in_child() -> None:
    # The forking thread is the child's only thread, with the same ident: another thread forking at the same
    # moment (a library caller's) gets a child with every hook.
    if _exec_forker is not None and _exec_forker == _thread.get_ident():
        return
    for hook in _HOOKS:
        hook()


if hasattr(posix, "register_at_fork"):
    posix.register_at_fork(after_in_child=_after_fork_in_child)


def exec_fork() -> int:
    """os.fork() for a child that will exec or _exit without running the engine again: no `in_child` hook runs
    in it. Returns 0 in the child, the child's pid in the parent."""
    global _exec_forker
    _exec_forker = _thread.get_ident()
    try:
        return posix.fork()
    finally:
        _exec_forker = None


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


PR_SET_PDEATHSIG = 1
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
        prctl(PR_SET_PDEATHSIG, 9)
        if posix.getppid() != parent:  # the parent died between the fork and the prctl
            posix._exit(70)

    posix.register_at_fork(after_in_child=hook)
    return True
