# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: run a module's AnsiballZ payload on the host while holding a lock.

This is the host side of hostlock.core.locked, written to be reused by any hostlock.core plugin that must
run one module under a lock (the serialize callback may wrap its per-host work with it too):

    from ansible_collections.hostlock.core.plugins.module_utils._runner import run_locked
    result = run_locked(lock, payload, timeout=..., own_marker=...)

`payload` is the wrapped module exactly as the controller builds it for pipelining (ActionBase
`_configure_module(...).b_module_data`, arguments and `_ansible_*` settings embedded), so the
child runs it the way Ansible itself would: `<interpreter>` reading the script on stdin, its stdout being
the module's JSON. The caller's process (the `locked` module on the host) is the lock holder:

- the lock is taken before the child starts and released only after the child has exited, whatever
  happened: a failed module, SIGTERM/SIGINT/SIGHUP to the runner (forwarded to the child, then waited for);
- the child gets PR_SET_PDEATHSIG=SIGKILL (Linux): a SIGKILLed runner takes its child with it, so work
  never goes on without the lock;
- a controller that dies or a dropped SSH connection does not touch either process (no tty, no SIGHUP):
  the work runs to its end under the lock, and the lock is freed when it ends. No lease is involved.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from .hostlock import Lock, LockTimeout

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_LIBC: Any = None
try:  # Linux: let the kernel kill the wrapped module when the runner dies (SIGKILL cannot be caught)
    import ctypes

    _LIBC = ctypes.CDLL(None, use_errno=True)
except (ImportError, OSError):  # no ctypes or no libc symbol table: signals are still forwarded
    pass

# Signals a runner forwards to its child instead of dying: the lock must outlive the work.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# How often a wait re-checks whether the lock is held by the caller's own run (see `own_holders`) and
# whether the controller is still there to receive the result (see `controller_gone`).
SELF_CHECK_EVERY = 1.0


class ControllerGone(Exception):
    """Nobody reads our result any more (controller killed, connection dropped) while we waited."""


class SelfWait(Exception):
    """The lock is held by the caller's own run: waiting would last until the run gives up on itself."""

    def __init__(self, holders: list) -> None:
        super().__init__("held by this run")
        self.holders = holders


def _become_subreaper() -> bool:
    """Adopt our descendants when their parent dies (Linux 3.4+), so an interrupted module's children can
    be waited for before the lock is released."""
    if _LIBC is None:
        return False
    return _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _reap_all() -> None:
    """Wait for every child and adopted orphan: the interrupted work is over only when they are."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the forked child
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # the parent may have died between fork and prctl: then nobody holds the lock for us
    if os.getppid() != parent:
        os._exit(137)


def own_holders(holders: list, marker: str | None) -> list:
    """Live holders whose label carries `marker` (the controller's run id): the caller's own run."""
    if not marker:
        return []
    return [h for h in holders if not h.get("stale") and marker in (h.get("label") or "")]


def controller_gone(fd: int = 1) -> bool:
    """Whether the reading end of our stdout is closed: the controller or its connection is gone.

    The module's stdout is the pipe (or socket) to ansible's local connection or sshd; when that side
    closes, poll() reports POLLERR/POLLHUP on our end. A terminal or a file never does.
    """
    try:
        p = select.poll()
        p.register(fd, select.POLLERR | select.POLLHUP)
        return any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _fd, ev in p.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll() on this platform: assume it is there
        return False


def acquire(
    lock: Lock,
    timeout: float | None,
    holders_of: object = None,
    marker: str | None = None,
    watch_controller: bool = True,
) -> float:
    """Take `lock`, waiting up to `timeout` (None: as long as it takes); returns the seconds waited.

    With a `marker`, gives up at once (SelfWait) when the lock is held by a holder whose label carries
    it: the controller's own run, which would never release it while we wait. The wait is cut into
    SELF_CHECK_EVERY slices to notice a holder of our run that won a race with us. With
    `watch_controller`, gives up (ControllerGone) once nobody reads our stdout: a Ctrl-C'd or killed
    controller must not have its task run later, when the lock comes free.
    """
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    while True:
        if watch_controller and controller_gone():
            raise ControllerGone()
        if marker and holders_of is not None:
            mine = own_holders(holders_of(), marker)  # type: ignore[operator]
            if mine:
                raise SelfWait(mine)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        sliced = marker or watch_controller
        step = left if not sliced else (SELF_CHECK_EVERY if left is None else min(left, SELF_CHECK_EVERY))
        try:
            lock.acquire(timeout=step)
            return round(time.monotonic() - started, 3)
        except LockTimeout:
            if deadline is not None and time.monotonic() >= deadline:
                raise


def run_payload(payload: bytes, interpreter: str | None = None) -> tuple[dict, int]:
    """Run an AnsiballZ payload as Ansible pipelining does; returns (module result, child pid).

    Forwards SIGTERM/SIGINT/SIGHUP to the child and keeps waiting for it: the caller releases its lock
    only after this returns, i.e. after the wrapped module is gone. When the module was interrupted (a
    forwarded signal, or it died of one), also waits for the processes it started, which the runner
    adopts as subreaper: a module killed mid-way leaves its commands running, and they are the work.
    A module that ends normally may leave daemons behind on purpose; those are not waited for.
    """
    interpreter = interpreter or sys.executable
    parent = os.getpid()
    got: list = []
    adopting = _become_subreaper()
    child = subprocess.Popen(
        [interpreter],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: _die_with_parent(parent),  # noqa: PLW1509 - needed for PR_SET_PDEATHSIG
        close_fds=True,  # the lock's descriptors stay with us: a module's daemons never keep the lock
    )

    def forward(signum: int, _frame: object) -> None:
        got.append(signum)
        try:
            child.send_signal(signum)
        except OSError:  # already gone
            pass

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        while True:
            try:
                out, err = child.communicate(payload)
                break
            except (InterruptedError, KeyboardInterrupt):  # pragma: no cover - handlers replace SIGINT
                continue
            except ValueError:  # communicate() again after a signal: stdin already closed
                payload = None  # type: ignore[assignment]
        if adopting and (got or (child.returncode or 0) < 0):
            _reap_all()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    result = parse_result(out, err, child.returncode)
    if got:
        names = ", ".join(signal.Signals(s).name for s in got)
        result.setdefault("failed", True)
        result["msg"] = (
            f"{result.get('msg') or ''} (the task was interrupted by {names}; the lock was held until "
            "the wrapped module ended)".strip()
        )
    return result, child.pid


def parse_result(out: bytes, err: bytes, rc: int | None) -> dict:
    """The module's JSON result, or a MODULE FAILURE result like the controller's when there is none."""
    text = out.decode("utf-8", "surrogateescape")
    start = text.find("{")
    end = text.rfind("}")
    if start >= 0 and end > start:
        try:
            data = json.loads(text[start : end + 1])
            if isinstance(data, dict):
                return data
        except ValueError:
            pass
    return dict(
        failed=True,
        msg="MODULE FAILURE: the wrapped module printed no result (see module_stdout, module_stderr)",
        module_stdout=text,
        module_stderr=err.decode("utf-8", "replace"),
        rc=rc,
    )


def run_locked(
    lock: Lock,
    payload: bytes,
    timeout: float | None = None,
    *,
    holders_of: object = None,
    marker: str | None = None,
    module: str | None = None,
) -> dict:
    """Take `lock`, run `payload` under it, release; returns the module's result plus lock timings.

    Raises LockTimeout (not taken in time), SelfWait (held by our own run) or ControllerGone (nobody
    waits for the result any more) before anything runs.
    The returned result's "hostlock" key carries waited/held seconds (measured here, on the host).
    """
    waited = acquire(lock, timeout, holders_of, marker)
    held_from = time.monotonic()
    try:
        if module:
            lock.update_record(job_cmdline=f"ansible module {module}")
        result, _pid = run_payload(payload)
    finally:
        lock.release()
    result["hostlock"] = dict(waited=waited, held=round(time.monotonic() - held_from, 3), released=True)
    return result
