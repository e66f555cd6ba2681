# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: run a module's AnsiballZ payload on the host while holding a lock.

This is the host side of hostlock.core.locked, written to be reused by any hostlock.core plugin that must
run one module under a lock (the serialize callback may wrap its per-host work with it too):

    from ansible_collections.hostlock.core.plugins.module_utils._runner import run_locked
    result = run_locked(lock, payload, timeout=..., marker=...)

`payload` is the wrapped module exactly as the controller builds it for pipelining (ActionBase
`_configure_module(...).b_module_data`, arguments and `_ansible_*` settings embedded), so the
child runs it the way Ansible itself would: `<interpreter>` reading the script on stdin, its stdout being
the module's JSON. The caller's process (the `locked` module on the host) is the lock holder:

- the lock is taken before the child starts and released only after the child has exited, whatever
  happened: a failed module, or any signal of hostlock.core.signals.FORWARDED (every one that would end the
  runner), forwarded to the child by the engine's proc.forward as `hostlock run` forwards them, then waited for;
- the child gets PR_SET_PDEATHSIG=SIGKILL (Linux, proc.deathsig): a SIGKILLed runner takes its child with it,
  so work never goes on without the lock;
- both leave the session and process group they were started in (`detach`): a controller that dies
  (Ctrl-C, SIGTERM, SIGKILL), ansible-core's workers signalling their process groups, and a dropped SSH
  connection (the hangup of the `ssh -tt` terminal Ansible uses without pipelining) reach neither, so the
  work runs to its end under the lock, and the lock is freed when it ends. No lease is involved. Only a
  signal sent to the runner's own pid (`kill PID`, `hostlock break --force`) is forwarded to the work.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import typing as t

from .hostlock import Lock, LockTimeout
from .hostlock import lease as _lease
from .hostlock.core.signals import FORWARDED
from .hostlock.core.signals import name as signal_name
from .hostlock.host.pathlock import PathLock
from .hostlock.proc import forward
from .hostlock.proc.deathsig import become_subreaper, die_with_parent, prctl_function

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


_DETACHED: list = []


def detach() -> bool:
    """Leave the caller's session and process group for a new session without a controlling terminal.

    Without pipelining Ansible's ssh connection runs modules under `ssh -tt`: the module is in the
    terminal's session, and the hangup of that terminal when the controller or its connection goes
    (SIGHUP, SIGCONT to the session) would end the work. On the local connection the module is in its
    worker's process group, which ansible-playbook signals (killpg) on Ctrl-C and SIGTERM. A new session
    is out of reach of both. Returns False where the caller leads its process group already (setsid(2)
    refuses): the work child detaches anyway (see _child_main). Idempotent. The module calls it first,
    before it waits: a controller's Ctrl-C then ends a wait by closing our stdout (ControllerGone).
    """
    if _DETACHED:
        return _DETACHED[0]
    try:
        os.setsid()
        _DETACHED.append(True)
    except OSError:  # EPERM: a process group leader cannot start a session
        _DETACHED.append(False)
    return _DETACHED[0]


def _new_session() -> None:  # pragma: no cover - runs in the forked child
    """The work's own session: a signal to the runner's group or a hangup of a terminal never reaches it."""
    try:
        os.setsid()
    except OSError:  # the runner could not detach either: still forwarded signals only, then
        pass


def _reap_all() -> None:
    """Wait for every child and adopted orphan: the interrupted work is over only when they are."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue


def own_holders(holders: list, marker: str | None, uid: int | None = None) -> list:
    """Live holders whose label carries `marker` (the controller's run id): the caller's own run.

    A label is text its holder chose: another user can copy a run's "[run ID]" into a lock of their own. So on
    a host (`uid`: ours) a holder is the run's only when the kernel proves it holds the lock and it runs as
    us (`verified`, its real uid); anyone else's is waited for like any holder. (Fleet labels are written by
    those etcd lets write the prefix, who may end our locks anyway.)
    """
    if not marker:
        return []
    return [h for h in holders if not h.get("stale") and marker in (h.get("label") or "")
            and (uid is None or (h.get("verified") is True and h.get("uid") == uid))]


def controller_gone(fd: int = 1, controller: str | None = None) -> bool:
    """Whether the reading end of our stdout is closed, or the controller process is: the run is gone.

    The module's stdout is the pipe (or socket) to ansible's local connection or sshd; when that side
    closes, poll() reports POLLERR/POLLHUP on our end. A terminal or a file never does. On the local
    connection a SIGKILLed ansible-playbook leaves its worker reading our stdout: `controller` ("PID:START",
    the run's process as the action saw it, on this same machine) is then what tells that the run is gone.
    """
    if controller:
        from .hostlock.core.owner import is_alive

        pid, _sep, start = controller.partition(":")
        if pid.isdigit() and start.isdigit() and is_alive(int(pid), start, None, None) is False:
            return True
    try:
        p = select.poll()
        p.register(fd, select.POLLERR | select.POLLHUP)
        return any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _fd, ev in p.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll() on this platform: assume it is there
        return False


def acquire(
    lock: Lock | PathLock | LeaseTake,
    timeout: float | None,
    holders_of: object = None,
    marker: str | None = None,
    watch_controller: bool = True,
    controller: str | None = None,
) -> float:
    """Take `lock`, waiting up to `timeout` (None: as long as it takes); returns the seconds waited.

    With a `marker`, gives up at once (SelfWait) when the lock is held by a holder whose label carries
    it: the controller's own run, which would never release it while we wait. The wait is cut into
    SELF_CHECK_EVERY slices to notice a holder of our run that won a race with us. With
    `watch_controller`, gives up (ControllerGone) once nobody reads our stdout: a Ctrl-C'd or killed
    controller must not have its task run later, when the lock comes free.
    """
    started = time.monotonic()
    try:  # the common case, a free lock: no status scan, no slices
        lock.acquire(timeout=0)
        return round(time.monotonic() - started, 3)
    except LockTimeout:
        if timeout == 0:
            raise
    deadline = None if timeout is None else started + timeout
    while True:
        if watch_controller and controller_gone(controller=controller):
            raise ControllerGone()
        if marker and holders_of is not None:
            mine = own_holders(holders_of(), marker, os.geteuid())  # type: ignore[operator]
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


class _SharedPackagePath(list):
    """A package's __path__ that also looks inside every AnsiballZ zip on sys.path.

    A forked runner already imported ansible.module_utils.basic and friends from its own payload zip; the
    wrapped payload puts its zip on sys.path and imports its module (and module_utils the runner's zip
    lacks) through these packages. Modules both zips hold were built by the same controller, so they are
    the same code: the child reuses them instead of importing them again (most of a module's start-up).
    """

    def __init__(self, original: list[str], parts: list[str]) -> None:
        super().__init__(original)
        self._parts = parts

    def __iter__(self) -> t.Iterator[str]:
        seen = list(super().__iter__())
        for entry in sys.path:
            if isinstance(entry, str) and entry.endswith(".zip"):
                candidate = os.path.join(entry, *self._parts)
                if candidate not in seen:
                    seen.append(candidate)
        return iter(seen)


def _share_packages() -> None:
    for name, mod in list(sys.modules.items()):
        if (name == "ansible" or name.startswith(("ansible.", "ansible_collections"))) and isinstance(
            getattr(mod, "__path__", None), list
        ):
            mod.__path__ = _SharedPackagePath(list(mod.__path__), name.split("."))


def _child_main(payload: bytes, out_w: int, err_w: int, parent: int, mask: set[int],
                prctl: t.Callable[..., int] | None) -> None:  # pragma: no cover - in the child
    """Run the wrapped AnsiballZ payload in this forked child as its interpreter would; never returns."""
    code = 1
    # The runner's exit handlers (its own AnsibleModule's temporary directory) are not the child's: a
    # forked child would run them too. The wrapped module's own (AnsibleModule.tmpdir's cleanup under
    # pipelining, files a module registers) must run, as they would at its interpreter's exit.
    _clear_exit_handlers()
    try:
        _child_signals(mask)
        _new_session()
        die_with_parent(prctl, parent, signal.SIGKILL, 137)  # the parent died already: nobody holds the lock
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in {null, out_w, err_w} - {0, 1, 2}:
            os.close(fd)
        _share_packages()
        script = os.path.join(os.getcwd(), "AnsiballZ_wrapped.py")
        sys.argv = [script]
        exec(compile(payload, script, "exec"), {"__name__": "__main__", "__file__": script})  # noqa: S102
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            sys.stderr.write(f"{e.code}\n")
    except BaseException:  # the module's own failure: report it as its interpreter would
        import traceback

        traceback.print_exc()
    finally:
        try:
            _run_exit_handlers()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # never unwind into the runner's own stack (its AnsiballZ cleanup)


def _clear_exit_handlers() -> None:  # pragma: no cover - in the child
    clear = getattr(atexit, "_clear", None)  # CPython 3.x; without it, no handler is run in the child at all
    if clear is not None:
        clear()


def _run_exit_handlers() -> None:  # pragma: no cover - in the child
    """What the interpreter would do at exit: run the handlers the wrapped module registered."""
    if getattr(atexit, "_clear", None) is None:
        return  # the runner's handlers could not be dropped: running them here would undo the runner's work
    run = getattr(atexit, "_run_exitfuncs", None)
    if run is not None:
        try:
            run()  # prints a failing handler's traceback to stderr itself, as at interpreter exit
        except BaseException:  # noqa: BLE001 - a handler's failure must not change the module's result
            pass


def _child_signals(mask: set[int]) -> None:  # pragma: no cover - in the child
    """The signal state the work starts with: forwarded signals at their default action, the mask from before the
    runner blocked them (a signal forwarded before this point is pending, and acts now)."""
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _fork_payload(payload: bytes, mask: set[int], prctl: t.Callable[..., int] | None) -> tuple[int, int, int]:
    """Start the payload in a forked child; returns its pid and the read ends of its stdout and stderr."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(out_r)
        os.close(err_r)
        _child_main(payload, out_w, err_w, parent, mask, prctl)
    os.close(out_w)
    os.close(err_w)
    return pid, out_r, err_r


class _Pipes:
    """The child's stdout and stderr read to their end, and its stdin written (the payload, for a fresh
    interpreter), by threads: the main thread meanwhile waits for the child's end and forwards its signals
    (created with those signals blocked, the threads never get one)."""

    def __init__(self, out_r: int, err_r: int, stdin_w: int | None = None, data: bytes | None = None) -> None:
        self.chunks: dict = {out_r: [], err_r: []}
        self.threads = [threading.Thread(target=self._read, args=(fd,), daemon=True) for fd in (out_r, err_r)]
        if stdin_w is not None:
            self.threads.append(threading.Thread(target=self._write, args=(stdin_w, data or b""), daemon=True))
        for thread in self.threads:
            thread.start()
        self.out, self.err = out_r, err_r

    def _read(self, fd: int) -> None:
        try:
            while True:
                data = os.read(fd, 65536)
                if not data:
                    return
                self.chunks[fd].append(data)
        except OSError:
            return
        finally:
            os.close(fd)

    @staticmethod
    def _write(fd: int, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError:  # EPIPE: the interpreter ended without reading it all; its result says why
            pass
        finally:
            os.close(fd)

    def collected(self) -> tuple[bytes, bytes]:
        """Everything the child wrote, once both pipes reached their end (as Popen.communicate)."""
        for thread in self.threads:
            thread.join()
        return b"".join(self.chunks[self.out]), b"".join(self.chunks[self.err])


# Fork the payload (reusing the runner's imports) where fork exists and the payload is a Python AnsiballZ
# wrapper of the kind that runs its module through `_ansiballz_main`; else start a fresh interpreter.
FORK = hasattr(os, "fork")


def run_payload(payload: bytes, interpreter: str | None = None,
                tick: tuple[float, t.Callable[[], object]] | None = None) -> tuple[dict, int]:
    """Run an AnsiballZ payload as Ansible pipelining does; returns (module result, child pid).

    With `tick` (seconds, function), calls the function that often while the module runs (a lease's renewal).

    Forwards every signal that would end the runner (hostlock.core.signals.FORWARDED, through proc.forward) to
    the child and keeps waiting for it: the caller releases its lock only after this returns, i.e. after the
    wrapped module is gone. When the module was interrupted (a forwarded signal, or it died of one), also
    waits for the processes it started, which the runner adopts as subreaper: a module killed mid-way leaves
    its commands running, and they are the work. A module that ends normally may leave daemons behind on
    purpose; those are not waited for.
    """
    interpreter = interpreter or sys.executable
    parent = os.getpid()
    prctl = prctl_function()
    adopting = become_subreaper(prctl)
    mask = forward.block()  # before the fork: a signal meant for the work never ends the runner
    try:
        if FORK and b"_ansiballz_main" in payload:
            # the engine closes the lock's descriptors in a forked child (never unlocking them): the lock
            # stays ours alone, and the child dies with us (PR_SET_PDEATHSIG)
            pid, out_r, err_r = _fork_payload(payload, mask, prctl)
            pipes = _Pipes(out_r, err_r)
            popen = None
        else:
            popen = subprocess.Popen(
                [interpreter],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=lambda: _fresh_child(parent, mask, prctl),  # noqa: PLW1509 - for PR_SET_PDEATHSIG
                start_new_session=True,  # see _new_session
                close_fds=True,  # the lock's descriptors stay with us: a module's daemons never keep the lock
            )
            pid = popen.pid
            pipes = _Pipes(os.dup(popen.stdout.fileno()), os.dup(popen.stderr.fileno()),  # type: ignore[union-attr]
                           os.dup(popen.stdin.fileno()), payload)  # type: ignore[union-attr]
            for stream in (popen.stdin, popen.stdout, popen.stderr):
                stream.close()  # type: ignore[union-attr]
        child = forward.Child(pid, group=False, shares_group=False)
        got = child.wait(tick)
        status = child.status
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if popen is not None:
            popen.returncode = returncode  # reaped here
        out, err = pipes.collected()
        if adopting and (got or returncode < 0):
            _reap_all()
    finally:
        forward.restore(mask)
    result = parse_result(out, err, returncode)
    if got:
        names = ", ".join(signal_name(s) for s in got)
        result.setdefault("failed", True)
        result["msg"] = (
            f"{result.get('msg') or ''} (the task was interrupted by {names}; the lock was held until "
            "the wrapped module ended)".strip()
        )
    return result, pid


def _fresh_child(parent: int, mask: set[int], prctl: t.Callable[..., int] | None) -> None:  # pragma: no cover
    """In a fresh interpreter's child, before its exec: the signal state it starts with, dying with the runner."""
    _child_signals(mask)
    die_with_parent(prctl, parent, signal.SIGKILL, 137)


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
    lock: Lock | PathLock,
    payload: bytes,
    timeout: float | None = None,
    *,
    holders_of: object = None,
    marker: str | None = None,
    module: str | None = None,
    controller: str | None = None,
) -> dict:
    """Take `lock`, run `payload` under it, release; returns the module's result plus lock timings.

    Raises LockTimeout (not taken in time), SelfWait (held by our own run) or ControllerGone (nobody
    waits for the result any more) before anything runs.
    The returned result's "hostlock" key carries waited/held seconds (measured here, on the host).
    """
    waited = acquire(lock, timeout, holders_of, marker, controller=controller)
    held_from = time.monotonic()
    try:
        if module:
            lock.update_record(job_cmdline=f"ansible module {module}")
        result, _pid = run_payload(payload)
    finally:
        lock.release()
    result["hostlock"] = dict(waited=waited, held=round(time.monotonic() - held_from, 3), released=True)
    return result


class LeaseTake:
    """A heartbeat lease on the host, taken as acquire() takes a lock: the first step of a `locked` task whose
    module has its own action plugin (template, copy, ...), which runs several steps on the host.

    The lease is held by the engine's detached holder (hostlock.lease.hold, with in_flight), so it outlives
    this module run; the controller renews it afterwards and releases it after the task's last step.
    """

    def __init__(self, name: str, lease: float, *, mode: str, slots: int, directory: str | None,
                 label: str | None, path: str | None) -> None:
        self.name, self.lease, self.mode, self.slots, self.label, self.path = name, lease, mode, slots, label, path
        self.token: str | None = None
        if path:
            self.directory: str | None = None
        else:  # resolved here (the host's default, $HOSTLOCK_DIR), so the controller can name it when it releases
            probe = Lock(name, mode=mode, slots=slots, directory=directory, label=label)
            self.directory = probe.directory
            probe.close()

    def acquire(self, timeout: float | None = None) -> None:
        self.token = _lease.hold(self.name, self.lease, mode=self.mode, slots=self.slots, directory=self.directory,
                                 timeout=timeout, label=self.label, in_flight=True, path=self.path)

    def renew(self) -> None:
        if self.token:
            try:
                _lease.renew(self.name, self.token, directory=self.directory, path=self.path)
            except Exception:  # noqa: BLE001 - the next tick tries again; the lease is longer than a few ticks
                pass

    def release(self) -> None:
        if self.token:
            try:
                _lease.release(self.name, self.token, directory=self.directory, path=self.path)
            except Exception:  # noqa: BLE001 - gone already: nothing is held
                pass
            self.token = None


def run_leased(
    take: LeaseTake,
    payload: bytes,
    timeout: float | None = None,
    *,
    holders_of: object = None,
    marker: str | None = None,
    controller: str | None = None,
) -> dict:
    """Take the lease, run `payload` (the task's first step) under it, and keep the lease: the result's
    "hostlock" key carries the token, its in-flight environment and where it lives, for the controller.

    While the step runs, the lease is renewed from here (every quarter lease): the controller's heartbeat
    starts only once it has the token. The step's processes carry the in-flight mark (its children inherit
    it). If the controller is gone when the step ends, nobody could release the lease: it is given back here.
    Raises as run_locked before anything runs.
    """
    waited = acquire(take, timeout, holders_of, marker, controller=controller)
    held_from = time.monotonic()
    token = take.token or ""
    environment = _lease.in_flight_environment(token)
    os.environ.update(environment)
    try:
        result, _pid = run_payload(payload, tick=(max(0.05, take.lease / 4), take.renew))
    except BaseException:
        take.release()
        raise
    if controller_gone(controller=controller):
        take.release()
    # held: so far, by this host's clock (the controller adds its part, up to the release)
    result["hostlock"] = dict(waited=waited, held=round(time.monotonic() - held_from, 3), token=token, lease=take.lease,
                              environment=environment, directory=take.directory, interpreter=sys.executable)
    return result


def emit_result(result: dict, modlib: str | None = None) -> t.NoReturn:
    """Print a module result that AnsibleModule already formatted (the wrapped module's), and end.

    exit_json would format it a second time (invocation, warnings, deprecations are the wrapped module's);
    the controller reads the last JSON object of our stdout as the task's result. `modlib`: the module's
    `_modlib_path` global, for end_now().
    """
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    end_now(modlib)
    raise SystemExit(0)


def end_now(modlib: str | None) -> None:
    """End the process without the interpreter's teardown, once the result is written: the runner imported
    ansible's module_utils and the engine, and tearing them down is ~15-20 ms of Python 3.8's time on every
    locked task (what `hostlock run` saves the same way with os._exit). First what that teardown would do for
    us: the exit handlers (AnsibleModule's temporary directory, a coverage collector's data), the AnsiballZ
    wrapper's own clean-up (its `finally` removes the payload directory it made), the streams flushed.

    Returns, for the usual exit, unless `modlib` is the payload zip of an ansible-core AnsiballZ wrapper
    (`<tmp>/ansible_<module>_payload_XXXXXX/ansible_<module>_payload.zip`, ansible-core 2.19+): a wrapper
    laid out otherwise (a debugger's `explode`, a future ansible-core) has a clean-up we do not know.
    """
    if not modlib:
        return
    where, zipname = os.path.split(modlib)
    base = os.path.basename(where)
    if not (zipname.startswith("ansible_") and zipname.endswith("_payload.zip")
            and base.startswith(zipname[: -len(".zip")] + "_") and os.path.isdir(where)):
        return
    import shutil

    run = getattr(atexit, "_run_exitfuncs", None)
    if run is None:
        return
    try:
        run()  # prints a failing handler's traceback to stderr itself, as at interpreter exit
        shutil.rmtree(where, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)  # the result is written: nothing may change it now
