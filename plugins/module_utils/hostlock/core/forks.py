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
