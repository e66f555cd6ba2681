# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: keep a hostlock.core.lock lease alive from the controller while its run lives.

Not a public API; other collections must not import it.

A lease taken with `heartbeat: true` is short (its `lease`, 60 s by default); a small process on the
control node renews it every quarter lease for as long as the `ansible-playbook` run that took it lives:

- the matching `state: released` task stops it first (stop(), over an abstract Unix socket whose name
  carries a proof from the lease's secret: see _address);
- when the run ends, however it ends (normal end, Ctrl-C, SIGTERM, SIGKILL: it watches the run's
  process through a pidfd), it shortens the lease to EXPIRE_NOW so that the holder on the host frees the
  lock as soon as the run's in-flight work there has ended (the holder waits for processes carrying
  the lease's environment mark), then exits;
- when renewals cannot reach the host (a dropped connection, the heartbeat itself killed), the lease
  runs out on its own at most one `lease` after the last renewal;
- when the lease ended while the run lives (a renewal refused, or none reached the host for a whole lease), it
  stops renewing and stays, answering the release's stop() with LOST, so that release fails the task (the work
  since may have run unlocked) instead of reporting ok.

The process is double-forked from the task's worker (the engine's proc.daemon), in a session of its own (a
signal to the run's process group does not reach it: it must outlive the run long enough to say so), with
standard input, output and error on /dev/null (it never holds a caller's pipe open).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import select
import socket
import struct
import time
import typing as t

from ansible_collections.hostlock.core.plugins.module_utils.hostlock import lease as _lease
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.core.procstat import pidfd, start_ticks
from ansible_collections.hostlock.core.plugins.module_utils.hostlock.proc.daemon import detached

# Linux abstract namespace: nothing to clean up after a SIGKILL, no file another user could plant. Any
# user can bind any free abstract name, so the name must be one nobody else can know first: see _address.
SOCKET_PREFIX = "\0hostlock-heartbeat/"
# The lease a heartbeat sets when its run is gone: the holder on the host ends it at once (after the
# in-flight work).
EXPIRE_NOW = _lease.EXPIRE_NOW
# Renewals per lease: three may fail (a slow or briefly unreachable host) before the lease runs out.
RENEWALS_PER_LEASE = 4

# What a renewal reports: renewed; the lease is gone (released, or ran out): stop; could not tell: retry.
OK, GONE, UNREACHABLE = "ok", "gone", "unreachable"
# What stop() finds: no heartbeat; one that was renewing; one that lost its lease while the run lived (it stays
# to say so, until the release asks or the run ends: the release must fail, never report ok).
NONE, STOPPED, LOST = "", "stopped", "lost"


def _address(token: str) -> str:
    """`@hostlock-heartbeat/ID.PROOF`: the lease's public id (so a person can tell which lease it serves)
    and an HMAC of it under the lease's secret. The id is public as soon as the holder on the host binds
    its own socket (world-readable /proc/net/unix, `status`), so a name made of the id alone could be
    bound first by any local user, failing every heartbeat task (issue 22 item 4); the proof is known only
    to whoever has the token: the run that took the lease."""
    tid, _sep, secret = token.partition(".")
    if not tid or not secret:
        raise ValueError("a heartbeat needs the whole lease token")
    proof = hmac.new(secret.encode(), b"hostlock-heartbeat\0" + tid.encode(), hashlib.sha256).hexdigest()[:32]
    return SOCKET_PREFIX + tid + "." + proof


def _peer_uid(sock: socket.socket) -> int | None:
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))[1]


def stop(token: str, timeout: float = 10.0) -> str:
    """Tell the heartbeat of this lease (the whole token) to stop renewing and exit: STOPPED, LOST (its lease
    ended while the run lived), or NONE (no heartbeat of ours listens)."""
    try:
        address = _address(token)
    except ValueError:
        return NONE
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError:  # no heartbeat (never started, or gone already)
            return NONE
        if _peer_uid(sock) not in (None, os.getuid()):  # not our heartbeat: nothing of ours listens there
            return NONE
        sock.sendall(b"stop\n")
        answer = sock.recv(16)
        return STOPPED if answer.startswith(b"ok") else LOST if answer.startswith(b"lost") else NONE
    except OSError:
        return NONE
    finally:
        sock.close()


def start(renew: t.Callable[[float], str], token: str, lease: float, run_pid: int) -> int:
    """Start the heartbeat of one lease; returns its pid once it listens for stop().

    `renew(seconds)` renews the lease on the host through the task's connection and returns OK, GONE
    or UNREACHABLE; it runs in the heartbeat process, a copy of this worker.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Before the fork: stop() can reach it as soon as we return. On failure the socket is closed here.
    try:
        sock.bind(_address(token))
    except (OSError, ValueError):
        sock.close()
        raise
    sock.listen(8)
    run_fd = pidfd(run_pid)
    run_start = start_ticks(run_pid)

    def heartbeat(w: int) -> None:  # pragma: no cover - the heartbeat's own process
        os.close(w)
        _quiet_display()
        _Heartbeat(renew, sock, lease, run_pid, run_fd, run_start).loop()

    try:
        # Inherited pipes and files closed (a caller's pipe must see EOF); sockets kept: a connection plugin
        # may hold its session in one.
        r, daemon = detached(heartbeat, {sock.fileno()} | ({run_fd} if run_fd is not None else set()), sockets=True)
        os.close(r)
    finally:
        sock.close()
        if run_fd is not None:
            os.close(run_fd)
    return daemon


def _quiet_display() -> None:  # pragma: no cover - in the heartbeat
    """The worker's Display must never send from the heartbeat."""
    try:  # the worker's Display sends through the run's result queue: never from here
        from ansible.utils.display import Display

        Display()._final_q = None
    except Exception:  # noqa: BLE001 - output goes to /dev/null anyway
        pass


class _Heartbeat:  # pragma: no cover - runs in the heartbeat process; tested through real runs
    def __init__(self, renew: t.Callable[[float], str], sock: socket.socket, lease: float, run_pid: int,
                 run_fd: int | None, run_start: str | None) -> None:
        self.renew, self.sock, self.lease = renew, sock, lease
        self.run_pid, self.run_fd, self.run_start = run_pid, run_fd, run_start
        self.every = max(0.05, lease / RENEWALS_PER_LEASE)

    def run_gone(self) -> bool:
        if self.run_fd is not None:
            return bool(select.select([self.run_fd], [], [], 0)[0])
        return start_ticks(self.run_pid) != self.run_start

    def loop(self) -> None:
        last_ok = time.monotonic()
        next_renewal = last_ok + self.every
        while True:
            now = time.monotonic()
            watch = [self.sock] + ([self.run_fd] if self.run_fd is not None else [])
            # Without a pidfd, look at the run every half second.
            wait = max(0.0, next_renewal - now) if self.run_fd is not None else min(0.5, max(0.0, next_renewal - now))
            ready = select.select(watch, [], [], wait)[0]
            if self.sock in ready and self._stop_requested(b"ok\n"):
                return
            if self.run_gone():
                self.renew(EXPIRE_NOW)  # best effort: otherwise the lease runs out on its own
                return
            now = time.monotonic()
            if now < next_renewal:
                continue
            outcome = self.renew(self.lease)
            now = time.monotonic()
            if outcome == OK:
                last_ok = now
            elif outcome == GONE or now - last_ok >= self.lease:  # ended on the host, or surely run out by now
                self.lost()
                return
            next_renewal = now + self.every

    def lost(self) -> None:
        """The lease ended while the run lives: stay until its release asks (and answer that it was lost) or
        the run ends, so the release task fails rather than report ok."""
        watch = [self.sock] + ([self.run_fd] if self.run_fd is not None else [])
        while not self.run_gone():
            ready = select.select(watch, [], [], None if self.run_fd is not None else 0.5)[0]
            if self.sock in ready and self._stop_requested(b"lost\n"):
                return

    def _stop_requested(self, answer: bytes) -> bool:
        try:
            conn = self.sock.accept()[0]
        except OSError:
            return False
        try:
            conn.settimeout(5)
            uid = _peer_uid(conn)
            if uid is not None and uid not in (os.getuid(), 0):  # only the run's user (or root) may stop it
                return False
            if conn.recv(16).startswith(b"stop"):
                conn.sendall(answer)
                return True
            return False
        except OSError:
            return False
        finally:
            conn.close()
