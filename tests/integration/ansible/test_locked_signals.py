"""docs/ansible.md's table for hostlock.core.locked, one test per cell: what the controller's death does to the
lock and to the work, for the local connection and real SSH, with Ansible's default settings (pipelining
off: `ssh -tt`, the module on a terminal) and with pipelining on.

Cells: connection (local, ssh) x pipelining (off, on) x what happens to the controller (Ctrl-C: SIGINT to
ansible-playbook's process group; SIGTERM and SIGKILL of its pid; over SSH also a dropped connection) x
phase (the wrapped work runs; the task waits for the lock). Every wait is on an event: the work writes a
line and holds until the test creates its gate file; the test finds the waiting task by its environment
mark on the host. The work traps nothing: a signal or hangup that reached it would end it, and its `out`
line would be missing. Timestamps (each line's own `date +%s.%N`) prove no overlap.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import NEXT, Sshd, ended, hostlock_cli
from harness import wait_for as _wait_for

# The wrapped work: nothing trapped, so whatever reaches it ends it before its `out` line.
WORK = 'echo "in $$ $(date +%s.%N)" >> {events}; while [ ! -e {gate} ]; do sleep 0.02; done; ' \
       'echo "out $$ $(date +%s.%N)" >> {events}'
HOLDER = 'echo "held $$ $(date +%s.%N)" >> {events}; while [ ! -e {gate} ]; do sleep 0.02; done; ' \
         'echo "released $$ $(date +%s.%N)" >> {events}'

CELLS = [
    (conn, pipelining, how, phase)
    for conn in ("local", "ssh")
    for pipelining in ("off", "on")
    for how in ("ctrl-c", "sigterm", "sigkill", "drop")
    for phase in ("task", "wait")
    if not (how == "drop" and conn == "local")  # a local connection has nothing to drop
]


def _events(path: Path) -> list[tuple[str, int, float]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        word, pid, when = line.split()[:3]
        out.append((word, int(pid), float(when)))
    return out


def _marked(cell: str) -> list[int]:
    """Processes on this machine (the host) carrying the task's environment mark: the runner and its work."""
    needle = f"HOSTLOCK_TEST_CELL={cell}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _alive(pid: int) -> bool:
    return not ended(pid)


def _live(engine, ansible, lock: str) -> list:
    return [h for h in engine.holders(lock, directory=str(ansible.lockdir)) if not h.stale]


def _playbook(ansible, host: str, cell: str, events: Path, gate: Path) -> str:
    playbook = ansible.work / f"{cell}.yml"
    playbook.write_text(
        f"- hosts: {host}\n  gather_facts: false\n  tasks:\n"
        "    - name: Work under the lock until the gate opens\n"
        f"      environment:\n        HOSTLOCK_TEST_CELL: {cell}\n"
        "      hostlock.core.locked:\n"
        f"        name: {cell}\n        directory: '{{{{ lockdir }}}}'\n"
        "        task:\n          ansible.builtin.shell: |\n"
        f"            {WORK.format(events=events, gate=gate)}\n"
    )
    return str(playbook)


def _strike(proc: subprocess.Popen, how: str, server: Sshd | None) -> None:
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: SIGINT to the foreground process group
    elif how == "sigterm":
        os.kill(proc.pid, signal.SIGTERM)  # `kill PID` of ansible-playbook
    elif how == "sigkill":
        os.kill(proc.pid, signal.SIGKILL)  # `kill -9 PID` of ansible-playbook
    else:
        assert server is not None
        server.drop_connections()  # the network drops: sshd and its session daemons are gone


@pytest.mark.parametrize("conn,pipelining,how,phase", CELLS, ids=["-".join(c) for c in CELLS])
def test_locked_table_cell(ansible, engine, tmp_path, conn, pipelining, how, phase):
    cell = f"{conn}-{pipelining}-{how}-{phase}"
    events, gate, hold_gate = tmp_path / "events", tmp_path / "gate", tmp_path / "hold-gate"
    server = None
    host = "loc" if conn == "local" else "ssh1"
    if how == "drop":  # its own server: the shared one must survive the drop
        server = Sshd(tmp_path / "sshd-dropped").start()
        ansible.inventory.write_text("[ssh]\n" + server.inventory_line("dropped", ansible.python) + "\n")
        host = "dropped"
    holder = proc = nxt = None
    try:
        if phase == "wait":
            holder = subprocess.Popen([*hostlock_cli(), "run", "-d", str(ansible.lockdir), cell, "sh", "-c",
                                       HOLDER.format(events=events, gate=hold_gate)])
            _wait_for(lambda: [e for e in _events(events) if e[0] == "held"], "the host job to hold the lock")
        proc = ansible.popen(_playbook(ansible, host, cell, events, gate),
                             ANSIBLE_PIPELINING="True" if pipelining == "on" else "False")
        if phase == "task":
            work_pid = _wait_for(lambda: next((e[1] for e in _events(events) if e[0] == "in"), 0),
                                 "the wrapped work to start")
        else:
            # waiting for the lock: its runner is in the lock's queue (a process alone may still read its module)
            _wait_for(lambda: _marked(cell) and engine.status(cell, directory=str(ansible.lockdir)).waiters > 0,
                      "the locked task to wait for the lock on the host")
            assert not [e for e in _events(events) if e[0] == "in"], "the task ran while the lock was held"
        _strike(proc, how, server)
        proc.communicate(timeout=120)

        if phase == "task":
            # The controller is gone. The work runs on, under the lock, untouched by what ended the run.
            assert _alive(work_pid), f"{cell}: the wrapped work was killed with the controller"
            assert _live(engine, ansible, cell), f"{cell}: the lock was freed while the work runs"
            nxt = subprocess.Popen([*hostlock_cli(), "run", "-w", "120", "-d", str(ansible.lockdir), cell,
                                    sys.executable, "-c", NEXT, str(events), str(work_pid)])
            _wait_for(lambda: engine.status(cell, directory=str(ansible.lockdir)).waiters > 0 or nxt.poll() is not None,
                      "the next job to wait for the lock")
            assert nxt.poll() is None, f"{cell}: the next job ran beside the work"
            gate.touch()
            assert nxt.wait(timeout=120) == 0
            words = [e[0] for e in _events(events)]
            assert words == ["in", "out", "next"], f"{cell}: {words}"
            got = {e[0]: e[2] for e in _events(events)}
            assert got["next"] >= got["out"], f"{cell}: the next holder started before the work ended"
        else:
            if how != "sigkill":
                # The waiter learns that nobody reads its result any more and gives up: the task never runs.
                _wait_for(lambda: not _marked(cell), "the waiting task to give up")
            hold_gate.touch()
            assert holder.wait(timeout=60) == 0
            if how == "sigkill":
                # kill -9 leaves what carried the task's connection (the local worker, ssh's ControlPersist
                # master): the host cannot tell, and the task runs once the lock is free, under the lock.
                _wait_for(lambda: "in" in [e[0] for e in _events(events)] or not _marked(cell), "the orphaned task")
                gate.touch()
                _wait_for(lambda: not _marked(cell), "the orphaned task to end")
            done = subprocess.run([*hostlock_cli(), "run", "-w", "60", "-d", str(ansible.lockdir), cell, "true"],
                                  check=False)
            assert done.returncode == 0
            words = [e[0] for e in _events(events)]
            print(f"\n{cell}: {' '.join(words)}")
            if how == "sigkill" and "in" in words:
                assert words == ["held", "released", "in", "out"], f"{cell}: {words}"
                got = {e[0]: e[2] for e in _events(events)}
                assert got["in"] >= got["released"], f"{cell}: the task ran while the host job held the lock"
            else:
                assert words == ["held", "released"], f"{cell}: the task ran after its controller was gone: {words}"
        _wait_for(lambda: not _live(engine, ansible, cell), "the lock to be free at the end")
    finally:
        gate.touch()
        hold_gate.touch()
        for p in (proc, nxt, holder):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        if server is not None:
            server.stop(sessions=True)


LEASE_CELLS = [(conn, pipelining, how) for conn in ("local", "ssh") for pipelining in ("off", "on")
               for how in ("ctrl-c", "sigterm", "sigkill") if not (how == "sigkill" and conn == "ssh")]


def _getfd(pid: int, fd: int) -> int:
    """A copy of process `pid`'s descriptor `fd` (pidfd_getfd(2), Linux 5.6; root may take any)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd, the same number on every architecture
        if got < 0:
            raise OSError(ctypes.get_errno(), f"pidfd_getfd({pid}, {fd})")
        return got
    finally:
        os.close(pidfd)


def _reader_gone(cell: str) -> bool:
    """Whether the waiting module's stdout has lost its reader, judged as the module itself does
    (_runner.controller_gone: POLLHUP or POLLERR) on a copy of that very descriptor; True once it has ended.
    The module is the marked process whose stdout is not /dev/null (its lease holders' is)."""
    for pid in _marked(cell):
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == os.devnull:
                continue
            fd = _getfd(pid, 1)
        except OSError:  # it ended meanwhile
            continue
        try:
            p = select.poll()
            p.register(fd, select.POLLERR | select.POLLHUP)
            if not any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in p.poll(0)):
                return False
        finally:
            os.close(fd)
    return True


def _session(sid: int) -> list[int]:
    """The processes of session `sid` (ansible-playbook's, see conftest's popen): its workers, their ssh."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            # ssh's ControlPersist master outlives the run by design; it carries no module's stdout
            if int(fields[3]) == sid and fields[0] not in ("Z", "X") and b"[mux]" not in cmdline:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("conn,pipelining,how", LEASE_CELLS, ids=["-".join(c) for c in LEASE_CELLS])
def test_lock_lease_task_killed_mid_wait_leaves_no_lease(ansible, engine, tmp_path, conn, pipelining, how):
    """hostlock.core.lock waiting for a lock when its controller is Ctrl-C'd, SIGTERMed or (local connection)
    SIGKILLed, and the lock comes free once the controller is gone, during the module's current waiting
    slice: the lease that slice takes is given back at once, not kept for its whole lease (600 s here) with
    nobody to release it. Over SSH the controller is gone when its connection is (the run's processes have
    ended); on the local connection, after kill -9, when ansible-playbook has (its worker lives on)."""
    cell = f"lease-{conn}-{pipelining}-{how}"
    events, hold_gate = tmp_path / "events", tmp_path / "hold-gate"
    holder = subprocess.Popen([*hostlock_cli(), "run", "-d", str(ansible.lockdir), cell, "sh", "-c",
                               HOLDER.format(events=events, gate=hold_gate)])
    proc = None
    try:
        _wait_for(lambda: [e for e in _events(events) if e[0] == "held"], "the host job to hold the lock")
        playbook = ansible.work / f"{cell}.yml"
        playbook.write_text(
            f"- hosts: {'loc' if conn == 'local' else 'ssh1'}\n  gather_facts: false\n  tasks:\n"
            "    - name: Take a lease, waiting\n"
            f"      environment:\n        HOSTLOCK_TEST_CELL: {cell}\n"
            "      hostlock.core.lock:\n"
            f"        name: {cell}\n        directory: '{{{{ lockdir }}}}'\n        lease: 600\n"
        )
        proc = ansible.popen(str(playbook), ANSIBLE_PIPELINING="True" if pipelining == "on" else "False")
        _wait_for(lambda: _marked(cell) and engine.status(cell, directory=str(ansible.lockdir)).waiters > 0,
                  "the lock task to wait for the lock on the host")
        _strike(proc, how, None)
        proc.communicate(timeout=120)
        if how != "sigkill":  # after kill -9 the worker lives on, reading the module's stdout
            _wait_for(lambda: not _session(proc.pid), "the run's workers and their connections to end")
            # The run's processes are gone, but over SSH its connection closes on the host only once ssh's
            # ControlPersist master (it outlives runs) and sshd have passed the news on: a lock that comes free
            # before then is answered to nobody, the one window docs/ansible.md says no design closes.
            _wait_for(lambda: _reader_gone(cell), "the host to see the controller's connection close")
        hold_gate.touch()  # the lock comes free while the task's waiting slice still runs
        assert holder.wait(timeout=60) == 0
        # the module, and any lease holder it started, end: nobody is left to release a lease later
        _wait_for(lambda: not _marked(cell), "the lock task and its lease holder to end")
        assert not _live(engine, ansible, cell), f"{cell}: a lease outlived the task that took it"
    finally:
        hold_gate.touch()
        for p in (proc, holder):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
