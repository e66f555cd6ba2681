"""`run`/`cron --metrics-dir DIR`: each job's figures in a file of its own, for node_exporter's textfile collector.

Loaded only when a run asks for metrics. One file per job, `hostlock-job-JOB.prom`, so that runs of different
jobs never write the same file (nothing of theirs to lose); runs of the same job (a skipped run beside the
running one, two slots) take turns on the job's own lock file (`.hostlock-job-JOB.lock`, flock) for the
read-update-write of its counters. Each write is a temporary file renamed over the last (the collector never
reads half a file).

Trust (docs/security.md): the directory's path is walked without following a link another user could have
planted (host.safepath); the directory must be one no other user can change entries of (root's or ours, not
writable by others, or sticky), else it is refused before the job runs. Every file opened in it is opened
relative to its descriptor, never through a link (O_NOFOLLOW), never blocking on a FIFO, and must be a plain
file of our own uid: the counters read back are only ever our own.
"""

from __future__ import annotations

import errno
import os
import time

from ..host import safepath as _safepath
from . import common as c

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Iterable

    from ..core.metrics import Family

ENV = "HOSTLOCK_METRICS_DIR"  # the default of --metrics-dir; empty or unset: no metrics
RESULTS = ("ok", "failed", "busy", "timeout", "lost")  # hostlock_job_runs_total's `result`, each kept from 0
_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class MetricsError(OSError):
    """The metrics directory or a file in it cannot be trusted or written: one line, the errno's exit code."""


def metrics_dir(value: str | None) -> str | None:
    """The directory in effect: --metrics-dir if given, else $HOSTLOCK_METRICS_DIR; '' (either) means none."""
    if value is None:
        value = os.environ.get(ENV) or ""
    return value or None


class JobMetrics:
    """The metrics file of one job in a trusted directory, opened (and checked) before the job runs."""

    def __init__(self, directory: str, job: str) -> None:
        self.directory, self.job = directory, job
        self.file = "hostlock-job-%s.prom" % job
        self.guard = ".hostlock-job-%s.lock" % job  # flock'd for the read-update-write of the job's counters
        try:
            self.dirfd = _safepath.open_path(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except _safepath.UnsafePath as exc:
            raise MetricsError(exc.errno, "metrics directory %s: %s" % (directory, exc)) from None
        except OSError as exc:
            raise MetricsError(exc.errno, "cannot open metrics directory %s: %s" % (directory, exc.strerror)) from None
        st = os.fstat(self.dirfd)
        why = None
        if st.st_uid not in (0, os.geteuid()):
            why = "it belongs to uid %d, another user, who could replace the files in it" % st.st_uid
        elif not _safepath._entries_safe(st):
            why = "other users can write to it (mode %o) and replace the files in it" % (st.st_mode & 0o7777)
        elif not os.access(".", os.W_OK | os.X_OK, dir_fd=self.dirfd):
            why = "it is not writable by uid %d" % os.geteuid()
        if why:
            os.close(self.dirfd)
            code = errno.EACCES if "writable by uid" in why else errno.EPERM
            raise MetricsError(code, "refusing metrics directory %s: %s (use a directory of root's or yours that "
                               "only its owner can write, as node_exporter's textfile directory is)" % (directory, why))
        for name in (self.file, self.guard):  # in a sticky directory another user may have made them first
            try:
                fst = os.stat(name, dir_fd=self.dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if (fst.st_mode & 0o170000) != 0o100000 or fst.st_uid != os.geteuid():
                os.close(self.dirfd)
                raise MetricsError(errno.EPERM, "refusing metrics directory %s: %s there is %s" % (
                    directory, name, "not a plain file" if (fst.st_mode & 0o170000) != 0o100000
                    else "uid %d's, not ours (uid %d): another user made it" % (fst.st_uid, os.geteuid())))

    def _open_own(self, name: str, flags: int, mode: int = 0o600) -> int:
        """A plain file of ours in the directory, never through a link; MetricsError if it is anything else."""
        fd = os.open(name, flags | _FLAGS, mode, dir_fd=self.dirfd)
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_uid != os.geteuid():
            os.close(fd)
            raise MetricsError(errno.EPERM, "refusing %s in metrics directory %s: %s" % (
                name, self.directory, "not a plain file" if (st.st_mode & 0o170000) != 0o100000
                else "it belongs to uid %d, not to us (uid %d)" % (st.st_uid, os.geteuid())))
        return fd

    def record(self, result: str, *, lock: str, wait: float | None, started: float | None = None,
               duration: float | None = None, exit_code: int | None = None, replaced: int = 0) -> None:
        """Count one run of the job (`result`: one of RESULTS) and, when it ran, its start, duration, exit code
        (and success); `wait`: how long it waited for `lock`. Raises MetricsError (an OSError)."""
        import fcntl

        from ..core.metrics import render

        try:
            guard = self._open_own(self.guard, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(guard, fcntl.LOCK_EX)  # only our uid (and root) can open it: 0600, ours
                values = self._read()
                _update(values, self.job, result, lock, wait, started, duration, exit_code, replaced)
                self._write(render(_families(self.job, values)))
            finally:
                os.close(guard)
        except MetricsError:
            raise
        except OSError as exc:
            raise MetricsError(exc.errno, "cannot write metrics for job %s in %s: %s"
                               % (self.job, self.directory, c.describe_error(exc))) from None

    def _read(self) -> dict[str, float]:
        """The samples of the job's last file, by series (the file is ours: see _open_own)."""
        try:
            fd = self._open_own(self.file, os.O_RDONLY)
        except FileNotFoundError:
            return {}
        try:
            chunks = []
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
        return parse(b"".join(chunks).decode("utf-8", "replace"))

    def _write(self, text: str) -> None:
        tmp = ".%s.%s" % (self.file, os.urandom(6).hex())  # a name the collector skips (it reads *.prom)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, 0o644, dir_fd=self.dirfd)
        try:
            try:
                os.fchmod(fd, 0o644)  # readable by node_exporter's user, whatever our umask
                data = text.encode("utf-8")
                while data:
                    data = data[os.write(fd, data):]
            finally:
                os.close(fd)
            os.rename(tmp, self.file, src_dir_fd=self.dirfd, dst_dir_fd=self.dirfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.dirfd)
            except OSError:
                pass
            raise

    def close(self) -> None:
        if self.dirfd >= 0:
            os.close(self.dirfd)
            self.dirfd = -1


def parse(text: str) -> dict[str, float]:
    """`series -> value` of a text-format file (comments skipped; a line that is no sample is ignored)."""
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _sp, value = line.rpartition(" ")
        try:
            values[name] = float(value)
        except ValueError:
            continue
    return values


# The job file's families: (name, type, unit, help). Their samples come from _update's series.
_JOB_FAMILIES = (
    ("hostlock_job_last_start_timestamp_seconds", "gauge", "seconds",
     "When the job's last run that ran it started (Unix time)."),
    ("hostlock_job_last_success_timestamp_seconds", "gauge", "seconds",
     "When the job's last successful run ended (Unix time; 0: never)."),
    ("hostlock_job_last_exit_code", "gauge", "",
     "Exit status of the job's last run that ran it (128+N: signal N; 124: --time-limit; 79: fleet lock lost)."),
    ("hostlock_job_last_duration_seconds", "gauge", "seconds", "How long the job's last run that ran it took."),
    ("hostlock_job_runs_total", "counter", "",
     "Runs of the job by result: ok, failed, busy (the lock was busy: skipped, or the wait ran out), timeout "
     "(--time-limit), lost (fleet lock lost)."),
    ("hostlock_job_replaced_total", "counter", "", "Runs of the job that ended a running copy first (--replace)."),
    ("hostlock_lock_last_wait_seconds", "gauge", "seconds",
     "How long the job's last run waited for the lock (taken or not)."),
)


def _job(job: str) -> tuple[tuple[str, str], ...]:
    return (("job", job),)


def _update(values: dict[str, float], job: str, result: str, lock: str, wait: float | None,
            started: float | None, duration: float | None, exit_code: int | None, replaced: int) -> None:
    from ..core.metrics import series

    key = {name: series(name, _job(job)) for name, *_rest in _JOB_FAMILIES}
    runs = series("hostlock_job_runs_total", (("job", job), ("result", result)))
    values[runs] = values.get(runs, 0.0) + 1
    if replaced:
        values[key["hostlock_job_replaced_total"]] = values.get(key["hostlock_job_replaced_total"], 0.0) + replaced
    if started is not None:
        values[key["hostlock_job_last_start_timestamp_seconds"]] = round(started, 3)
        values[key["hostlock_job_last_duration_seconds"]] = round(duration or 0.0, 6)
        values[key["hostlock_job_last_exit_code"]] = exit_code or 0
        if result == "ok":
            values[key["hostlock_job_last_success_timestamp_seconds"]] = round(time.time(), 3)
    if wait is not None:  # the job's lock only: a job whose lock was renamed leaves no series of the old one
        for s in [s for s in values if s.startswith("hostlock_lock_last_wait_seconds{")]:
            del values[s]
        values[series("hostlock_lock_last_wait_seconds", (("job", job), ("lock", lock)))] = round(wait, 6)


def _families(job: str, values: dict[str, float]) -> Iterable[Family]:
    """The job file's families from `values` (what _update made of the last file): the counters (every result
    from 0, so that a rate() sees the first failure) and the last success (0: never) always, the other gauges
    once the job has run."""
    from ..core.metrics import Family, series

    always = ("hostlock_job_runs_total", "hostlock_job_replaced_total", "hostlock_job_last_success_timestamp_seconds")
    for name, kind, unit, help_text in _JOB_FAMILIES:
        family = Family(name, kind, help_text, unit)
        if name == "hostlock_job_runs_total":
            names = [series(name, (("job", job), ("result", result))) for result in RESULTS]
        elif name == "hostlock_lock_last_wait_seconds":
            names = sorted(s for s in values if s.startswith(name + "{"))
        else:
            names = [series(name, _job(job))]
        family.samples.extend((s, values.get(s, 0.0)) for s in names if s in values or name in always)
        if family.samples:
            yield family
