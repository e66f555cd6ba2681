"""What a `run` or `cron` tells about itself when asked: its job's metrics file (`--metrics-dir`, cli/metrics.py)
and the lock's history in the journal (`--history`, cli/journal.py). Loaded only by a run that asks for either:
the commands' start-up path never imports it otherwise.

Both are settings a run must honour, so both are opened and checked before the lock is taken (fail closed: an
untrusted metrics directory or a host without a journal stops the run, the job never starts). What fails once
the job has run (a full disk, journald gone) is said in one line on stderr; the job's status stays the exit
status.
"""

from __future__ import annotations

import time

from . import common as c

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .metrics import JobMetrics
    from .options import Options, RunLock
    from .supervise import Outcome

HISTORY_ENV = "HOSTLOCK_HISTORY"  # "journal": the default of --history


def wanted(o: Options) -> bool:
    """Whether the run keeps metrics or history (the options' and the environment's word)."""
    return o.metrics_dir is not None or o.history


class RunLog:
    """One run's metrics and history; every method is a no-op for what was not asked for."""

    def __init__(self, o: Options, command: str) -> None:
        from ..core.names import validate_name

        self.o = o
        job = o.job or o.name or ""
        try:
            validate_name(job)
        except ValueError:
            raise c.UsageError("--metrics-dir and --history name the job: give --job NAME (%s is no job name)"
                               % c.quote(job), command) from None
        self.job = job
        self.metrics: JobMetrics | None = None
        self.wait: float | None = None
        self.replaced = 0
        self.acquired_at: float | None = None
        if o.history:
            from .journal import check

            check()
        if o.metrics_dir is not None:
            from .metrics import JobMetrics

            self.metrics = JobMetrics(o.metrics_dir, job)

    def _fields(self, lock: RunLock | None) -> dict[str, object]:
        o = self.o
        return {"job": self.job, "label": o.label, "command": c.join_command(o.command),
                "directory": _where(lock) if lock is not None else o.directory}

    def _journal(self, event: str, message: str, lock: RunLock | None, **fields: object) -> None:
        if not self.o.history:
            return
        from .journal import JournalUnavailable, send

        try:
            send(event, self.o.name or "", message, **self._fields(lock), **fields)
        except JournalUnavailable as exc:
            c.say(str(exc))

    def _metrics(self, result: str, started: float | None = None, duration: float | None = None,
                 exit_code: int | None = None) -> None:
        if self.metrics is None:
            return
        from .metrics import MetricsError

        try:
            self.metrics.record(result, lock=self.o.name or "", wait=self.wait, replaced=self.replaced,
                                started=started, duration=duration, exit_code=exit_code)
        except MetricsError as exc:
            c.say(str(exc))

    def acquired(self, lock: RunLock, waited: float) -> None:
        self.wait = waited
        self.acquired_at = time.monotonic()
        self._journal("acquired", "lock %s acquired after %s by job %s"
                      % (self.o.name, c.format_span(waited), self.job), lock, wait_seconds="%.6f" % waited)

    def replacing(self, lock: RunLock, ended: list) -> None:
        """The running copies `ended` (proven holders, core.holder.Holder) were ended by this run (--replace)."""
        self.replaced += len(ended)
        for h in ended:
            self._journal("replaced", "lock %s: ended the running copy, %s, to run job %s"
                          % (self.o.name, h.describe(), self.job), lock,
                          holder_pid=h.pid, holder_job_pid=h.job_pid)

    def busy(self, lock: RunLock | None, waited: float, text: str) -> None:
        """The lock was busy: skipped at once, or the wait ran out (history: busy or timeout; metrics: busy)."""
        self.wait = waited
        event = "timeout" if self.o.wait else "busy"
        self._journal(event, "%s; job %s not run" % (text, self.job), lock, wait_seconds="%.6f" % waited)
        self._metrics("busy")

    def failed(self, lock: RunLock | None, why: str) -> None:
        """The job could not be started (the lock could not be taken, the fork or the exec failed)."""
        self._metrics("failed")

    def ended(self, lock: RunLock, outcome: Outcome, code: int, lost: str | None) -> None:
        """The job ran: its result, once the lock is released."""
        if lost:
            result = "lost"
        elif outcome.timed_out:
            result = "timeout"
        else:
            result = "ok" if code == 0 else "failed"
        held = time.monotonic() - self.acquired_at if self.acquired_at is not None else outcome.elapsed
        if lost:
            self._journal("lost", "lock %s: %s" % (self.o.name, lost), lock, job_pid=outcome.pid)
        self._journal("released", "lock %s released after %s: job %s %s" % (
            self.o.name, c.format_span(held), self.job, outcome.describe()), lock,
            hold_seconds="%.6f" % held, result=result, exit_status=code, job_pid=outcome.pid)
        self._metrics(result, started=time.time() - outcome.elapsed, duration=outcome.elapsed, exit_code=code)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def _where(lock: RunLock) -> str:
    from .options import where

    try:
        return where(lock)
    except AttributeError:  # a --path lock has no directory
        return getattr(lock, "path", "") or ""


def begin(o: Options, command: str) -> tuple[RunLog | None, int]:
    """The run's RunLog, or (None, exit code) with the one line said: a job name that is none (64), a metrics
    directory that cannot be trusted or opened (66, or the errno's code), no journal for --history (69)."""
    try:
        return RunLog(o, command), 0
    except c.UsageError as exc:
        return None, c.usage_error(str(exc), command)
    except OSError as exc:  # journal.JournalUnavailable says its own code (69): not imported for metrics alone
        c.say(str(exc))
        return None, getattr(exc, "exit_code", None) or c.errno_exit_code(exc.errno, c.EX_NOINPUT)
