"""The command lines of `hostlock run` and `hostlock cron`: help texts, `Options`, `parse`, `make_lock`.

Parsed by hand with `cli.common.getopt` (argparse costs ~12 ms on a path started once per job).
"""

from __future__ import annotations

from ..core import oslite as os
from ..core.model import FLEET_TTL, MECHANISM_CHOICES
from ..proc.job import DEFAULT_KILL_AFTER, PROCESS_GROUPS, Job, new_group_for
from . import common as c

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable, Union

    from .. import Lock
    from ..host.pathlock import PathLock

    RunLock = Union[Lock, PathLock]  # what `run` and `cron` drive: a named (host or fleet) lock, or --path

_SHELL = "/bin/sh"  # -c uses /bin/sh like flock(1), never $SHELL: cron entries must not depend on a login shell

RUN_HELP = """\
usage: hostlock run [options] NAME [--] COMMAND [ARG...]
       hostlock run [options] NAME -c 'SHELL COMMAND'
       hostlock run [options] --path FILE [--] COMMAND [ARG...]

Run COMMAND while holding the lock NAME. hostlock stays the parent: signals it gets reach the job, the
job dies if hostlock is killed, and the job (and any daemon it starts) never inherits the lock.
Options are read up to the command or '--'; the command's own arguments pass untouched.

lock options:
  -x, -e, --exclusive      exclusive lock (default)
  -s, --shared             shared lock: any number of shared holders, no exclusive one
  --slots N                N-slot semaphore: at most N holders at once
  -n, --nb, --nonblock     do not wait: if the lock is busy, exit with the conflict code
  -w, --wait DURATION      wait at most DURATION (seconds, fractions allowed, or 250ms, 5m, 1h30m)
  -E, --conflict-exit-code CODE
                           exit code when the lock is busy or the wait times out (default 75)
  -d, --dir DIR            lock directory (default: $HOSTLOCK_DIR, /run/hostlock, per-user dir)
  --mechanism M            auto (default), ofd, flock or record
  --label TEXT             free text shown by 'hostlock status'
  --path FILE              instead of NAME: lock FILE as flock(1) does (flock(2); --mechanism ofd: OFD
                           fcntl locks), excluding flock(1) users of FILE; 'status --path FILE' shows it
fleet options (one lock across hosts, on etcd; docs/fleet.md):
  --fleet URL              etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (default: $HOSTLOCK_FLEET; '' = host
                           locks). The job gets HOSTLOCK_FENCE and HOSTLOCK_FLEET; if the lock is lost
                           it is stopped (SIGTERM, SIGKILL after --kill-after) and hostlock exits 79.
                           --dir, --mechanism and --path do not apply
  --ttl DURATION           the lock's etcd lease: how long it outlives a dead hostlock (default 10s)
  --fleet-password-file FILE
                           the password of the URL's user (etcd://USER@HOST): the first line of FILE, a
                           file of yours or root's that nobody else may read (default:
                           $HOSTLOCK_FLEET_PASSWORD_FILE, else $HOSTLOCK_FLEET_PASSWORD, which the job
                           never sees). A mistake in the fleet's settings exits 78
job options:
  -c, --command CMD        run CMD with /bin/sh -c
  --time-limit DURATION    the most the job may run: then SIGTERM, exit code 124 (--timeout is
                           refused: in flock(1) it means --wait)
  --kill-after DURATION    SIGKILL this long after the SIGTERM of --time-limit or of a lost fleet lock
                           (default 10s)
  --process-group MODE     auto (default: own group unless in a terminal's foreground), new, same
  --replace                if the lock is busy, end the running copy (your own job, proven to hold it:
                           SIGTERM, SIGKILL after --kill-after) and run; exclusive host locks only
what the run tells (docs/howto-metrics.md, docs/howto-history.md):
  --metrics-dir DIR        keep the job's figures in DIR/hostlock-job-JOB.prom for node_exporter's
                           textfile collector (default: $HOSTLOCK_METRICS_DIR; '' = none)
  --history                record the lock's events in the system journal ('hostlock history');
                           also $HOSTLOCK_HISTORY=journal. Without a journal: exit 69, nothing run
  --job NAME               the job's name in metrics and history (default: the lock's name)
other:
  -q, --quiet              no message when the lock is busy (like flock -n)
  -v, --verbose            say what happens, on stderr
  -h, --help               show this help

exit status: the job's own status; 128+N if it died of signal N; 124 after --time-limit; the conflict code
(-E, default 75) if the lock was busy; 64 usage; 65 lock error; 66 cannot open the lock file or
directory, or the metrics directory refused; 69 cannot execute the command, or --history without a
journal; 71 OS error; 73 read-only or full file system; 76 the fleet (etcd) unavailable within the wait;
79 the fleet lock was lost while the job ran.
"""

CRON_HELP = """\
usage: hostlock cron [options] [--] COMMAND [ARG...]
       hostlock cron [options] -c 'SHELL COMMAND'

The mode for cron entries: run COMMAND unless another copy still runs, and stay silent unless the job
fails. The job's stdout and stderr are captured (in an unlinked temporary file); on failure (non-zero exit,
signal, timeout) they are printed followed by one line with the status, so cron mails only what matters.

  --name NAME              lock name (default: cron-PROGRAM-HASH, from the command; see docs/cli.md)
  --on-conflict MODE       when another copy holds the lock: quiet (default: no output, exit 0),
                           report (one line on stderr, exit 0), fail (one line, exit 75)
  -E, --conflict-exit-code CODE
                           exit code on conflict, overriding the on-conflict default
  -w, --wait DURATION      wait up to DURATION for the other copy (default: do not wait)
  -n, --nb, --nonblock     do not wait (default)
  --time-limit DURATION    the most the job may run: then SIGTERM, SIGKILL after --kill-after (10s)
  --kill-after DURATION
  --syslog                 write one line per run to syslog (/dev/log): started job's result or skip
  --syslog-socket PATH     syslog socket to use (implies --syslog)
  --replace                if the lock is busy, end the running copy (your own job, proven to hold it:
                           SIGTERM, SIGKILL after --kill-after) and run instead of skipping
  --metrics-dir DIR, --history, --job NAME:
                           the job's figures for node_exporter, the lock's events in the journal (as for
                           run; --job defaults to the lock's name)
  -x, -s, --slots N, -d DIR, --mechanism M, --label TEXT, --process-group MODE, -c CMD, --path FILE,
  --fleet URL, --ttl DURATION, --fleet-password-file FILE:
                           as for run (a lost fleet lock is a failure: output, one line, exit 79)
  -v, --verbose            say what happens, on stderr (cron mails it)
  -h, --help               show this help

exit status: as for run (the job's status, 128+N, 124 after --time-limit, 76 fleet unavailable, 79 fleet
lock lost), and on conflict 0 (quiet, report) or 75 (fail), or -E CODE.
"""


class Options:
    """Parsed command line of `run` and `cron`."""

    __slots__ = ("name", "mode", "slots", "wait", "conflict_code", "directory", "mechanism", "label",
                 "command", "shell", "timeout", "kill_after", "pgroup", "quiet", "verbose", "help",
                 "on_conflict", "syslog", "syslog_socket", "_wait_opt", "path", "fleet", "fleet_given", "ttl",
                 "password_file", "kill_after_given", "metrics_dir", "job", "history", "replace")

    def __init__(self) -> None:
        self.name: str | None = None
        self.mode = "exclusive"
        self.slots = 1
        self.wait: float | None = None  # None waits forever
        self.conflict_code: int | None = None
        self.directory: str | None = None
        self.mechanism = "auto"
        self.label: str | None = None
        self.command: list[str] = []
        self.shell: str | None = None
        self.timeout: float | None = None
        self.kill_after = DEFAULT_KILL_AFTER
        self.pgroup = "auto"
        self.quiet = False
        self.verbose = False
        self.help = False
        self.on_conflict = "quiet"
        self.syslog = False
        self.syslog_socket = "/dev/log"
        self._wait_opt = ""
        self.path: str | None = None  # --path FILE: flock(1)'s lock on FILE instead of a named lock
        self.fleet: str | None = None  # the fleet URL in effect (--fleet, else $HOSTLOCK_FLEET); None: host lock
        self.fleet_given: str | None = None  # --fleet's value as given ('' = host locks), None if absent
        self.ttl: float | None = None  # --ttl: the fleet lock's lease; None: the engine's default
        self.password_file: str | None = None  # --fleet-password-file FILE
        self.kill_after_given = False  # a fleet lock's default --kill-after comes from its TTL
        self.metrics_dir: str | None = None  # --metrics-dir DIR, else $HOSTLOCK_METRICS_DIR (cli/metrics.py)
        self.job: str | None = None  # --job NAME: the job in metrics and history (default: the lock's name)
        self.history = False  # --history, or $HOSTLOCK_HISTORY=journal: the lock's events to the journal
        self.replace = False  # --replace: end the running copy (proven, ours) instead of skipping (cli/replace.py)


_RUN_SPEC = {
    "-x": ("exclusive", False), "-e": ("exclusive", False), "--exclusive": ("exclusive", False),
    "-s": ("shared", False), "--shared": ("shared", False),
    "--slots": ("slots", True),
    "-n": ("nb", False), "--nb": ("nb", False), "--nonblock": ("nb", False), "--no-wait": ("nb", False),
    "-w": ("wait", True), "--wait": ("wait", True),
    "-E": ("code", True), "--conflict-exit-code": ("code", True),
    "-d": ("dir", True), "--dir": ("dir", True),
    "--mechanism": ("mechanism", True),
    "--label": ("label", True),
    "--path": ("path", True),
    "--fleet": ("fleet", True),
    "--ttl": ("ttl", True),
    "--fleet-password-file": ("password_file", True),
    "-c": ("shell", True), "--command": ("shell", True),
    "--time-limit": ("timeout", True),
    "--timeout": ("timeout_refused", True),
    "--kill-after": ("kill_after", True),
    "--process-group": ("pgroup", True),
    "-q": ("quiet", False), "--quiet": ("quiet", False),
    "-v": ("verbose", False), "--verbose": ("verbose", False),
    "-h": ("help", False), "--help": ("help", False),
    "--metrics-dir": ("metrics_dir", True),
    "--job": ("job", True),
    "--history": ("history", False),
    "--replace": ("replace", False),
}
_CRON_SPEC = dict(_RUN_SPEC)
_CRON_SPEC.update({
    "--name": ("name", True),
    "--on-conflict": ("on_conflict", True),
    "--syslog": ("syslog", False),
    "--syslog-socket": ("syslog_socket", True),
})
_MECHANISMS = MECHANISM_CHOICES
_PGROUPS = PROCESS_GROUPS
_ON_CONFLICT = ("quiet", "report", "fail")


def parse(args: list[str], cron: bool) -> Options:
    """Parse `run`/`cron` arguments by hand (argparse costs ~12 ms); raises c.UsageError."""
    command = "cron" if cron else "run"
    o = Options()

    def handle(key: str, value: str | None, opt: str) -> None:
        if key == "exclusive":
            o.mode = "exclusive"
        elif key == "shared":
            o.mode = "shared"
        elif key == "slots":
            o.slots = c.count_arg(value or "", opt)
        elif key == "nb" or key == "wait":
            if o._wait_opt and o._wait_opt != opt:
                raise c.UsageError("%s and %s cannot be used together" % (o._wait_opt, opt), command)
            o._wait_opt = opt
            o.wait = 0.0 if key == "nb" else c.duration_arg(value or "", opt)
        elif key == "code":
            o.conflict_code = c.exit_code_arg(value or "", opt)
        elif key == "dir":
            if not value:
                raise c.UsageError("%s needs a directory" % opt, command)
            o.directory = value
        elif key == "mechanism":
            if value not in _MECHANISMS:
                raise c.UsageError("%s: invalid mechanism %r: use %s" % (opt, value, ", ".join(_MECHANISMS)),
                                   command)
            o.mechanism = value
        elif key == "label":
            o.label = value
        elif key == "path":
            if not value:
                raise c.UsageError("%s needs a file" % opt, command)
            o.path = value
        elif key == "fleet":
            o.fleet_given = value or ""
        elif key == "password_file":
            if not value:
                raise c.UsageError("%s needs a file" % opt, command)
            o.password_file = value
        elif key == "ttl":
            o.ttl = c.duration_arg(value or "", opt)
            if o.ttl <= 0:
                raise c.UsageError("%s must be more than 0" % opt, command)
        elif key == "shell":
            if o.shell is not None:
                raise c.UsageError("%s given twice" % opt, command)
            o.shell = value
        elif key == "timeout_refused":
            # flock(1)'s --timeout waits for the lock; ours used to limit the job's run time. Accepting
            # either meaning silently would change what a migrated script or an old cron line does.
            raise c.UsageError("%s is ambiguous: flock(1)'s --timeout waits for the lock (use -w/--wait "
                               "%s); to limit the job's run time use --time-limit %s"
                               % (opt, c.one_line(value or ""), c.one_line(value or "")),
                               command)
        elif key == "timeout":
            o.timeout = c.duration_arg(value or "", opt)
            if o.timeout <= 0:
                raise c.UsageError("%s must be more than 0" % opt, command)
        elif key == "kill_after":
            o.kill_after = c.duration_arg(value or "", opt)
            o.kill_after_given = True
        elif key == "pgroup":
            if value not in _PGROUPS:
                raise c.UsageError("%s: invalid mode %r: use %s" % (opt, value, ", ".join(_PGROUPS)), command)
            o.pgroup = value
        elif key == "quiet":
            o.quiet = True
        elif key == "verbose":
            o.verbose = True
        elif key == "help":
            o.help = True
        elif key == "name":
            o.name = value
        elif key == "on_conflict":
            if value not in _ON_CONFLICT:
                raise c.UsageError("%s: invalid mode %r: use %s" % (opt, value, ", ".join(_ON_CONFLICT)), command)
            o.on_conflict = value
        elif key == "syslog":
            o.syslog = True
        elif key == "syslog_socket":
            o.syslog = True
            o.syslog_socket = value or ""
        elif key == "metrics_dir":
            o.metrics_dir = value or ""
        elif key == "job":
            from ..core.names import validate_name

            try:
                o.job = validate_name(value)
            except ValueError as exc:
                raise c.UsageError("%s: %s" % (opt, str(exc).replace("lock name", "job name")), command) from None
        elif key == "history":
            o.history = True
        elif key == "replace":
            o.replace = True

    spec = _CRON_SPEC if cron else _RUN_SPEC
    i, dashdash = c.getopt(args, 0, spec, handle, command)
    if o.help:
        return o
    if not cron and o.path is None:
        if i >= len(args):
            raise c.UsageError("missing lock NAME and COMMAND", command)
        o.name = args[i]
        i += 1
        if not dashdash:  # options may also follow NAME (flock's `flock FILE -c CMD`)
            i, dashdash = c.getopt(args, i, spec, handle, command)
            if o.help:
                return o
    rest = args[i:]
    if o.shell is not None:
        if rest:
            raise c.UsageError("-c takes exactly one shell command; unexpected %s" % c.quote(rest[0]), command)
        if not o.shell.strip():
            raise c.UsageError("-c needs a non-empty shell command", command)
        o.command = [_SHELL, "-c", o.shell]
    elif not rest:
        raise c.UsageError("missing COMMAND (give it after NAME, after '--', or with -c)", command)
    elif not rest[0]:
        raise c.UsageError("the COMMAND is an empty word: give a program to run", command)
    else:
        o.command = rest
    if o.slots > 1 and o.mode == "shared":
        raise c.UsageError("--slots and --shared cannot be used together (a semaphore's slots are exclusive)",
                           command)
    if o.path is not None:
        if o.name is not None and not cron:
            raise c.UsageError("give a lock NAME or --path FILE, not both", command)
        if o.slots > 1 or o.directory is not None or o.mechanism == "record":
            raise c.UsageError("--path locks FILE as flock(1) does: --slots, --dir and --mechanism record do "
                               "not apply", command)
        if cron and o.name is not None:
            raise c.UsageError("give --name or --path, not both", command)
        o.name = o.path
    check_fleet(o, command)
    _check_observed(o, command)
    if cron and o.wait is None:
        o.wait = 0.0  # a cron run that finds the previous one still going is skipped, not queued
    return o


def check_fleet(o: Options, command: str) -> None:
    """Settle host lock or fleet lock, refusing options of the other kind (before any I/O).

    A fleet lock has no directory, mechanism or file: such an option beside a fleet (even one that came
    from $HOSTLOCK_FLEET) is a contradiction, never a silent fall-back to a lock this host alone sees.
    """
    o.fleet = c.fleet_arg(o.fleet_given)
    if o.fleet is not None or o.password_file is not None or os.getenv("HOSTLOCK_FLEET_PASSWORD") is not None:
        from ..fleet import url as _fleet

        # The password leaves our environment before any job could inherit it (host lock or fleet lock).
        _fleet.take_credentials(o.password_file)
    if o.fleet is None:
        for opt, given in (("--ttl", o.ttl is not None), ("--fleet-password-file", o.password_file is not None)):
            if given:
                raise c.UsageError("%s applies to fleet locks only (give --fleet URL or set $%s)"
                                   % (opt, c.FLEET_ENV), command)
        return
    c.refuse_host_options({"--path": o.path is not None, "--dir": o.directory is not None,
                           "--mechanism": o.mechanism != "auto"}, o.fleet_given, o.fleet, command)
    # The job of a fleet lock gets SIGTERM --kill-after before the lease can end (SIGKILL at that deadline),
    # so no job outlives its lock: the grace comes out of the TTL. Default TTL/4 (2.5 s of the default 10 s);
    # more than half the TTL would stop jobs between two keep-alives (every TTL/3) of a healthy lease.
    ttl = o.ttl if o.ttl is not None else FLEET_TTL
    if not o.kill_after_given:
        o.kill_after = min(DEFAULT_KILL_AFTER, ttl / 4)
    elif o.kill_after > ttl / 2:
        raise c.UsageError("--kill-after %s cannot be honoured with a fleet lock of --ttl %s: the job gets SIGTERM "
                           "that long before its lease can end, at most half the TTL (raise --ttl)"
                           % (c.format_span(o.kill_after), c.format_span(ttl)), command)


def _check_observed(o: Options, command: str) -> None:
    """--metrics-dir, --history and --replace settled from the options and the environment (cli/runlog.py)."""
    if o.metrics_dir is None:
        o.metrics_dir = os.getenv("HOSTLOCK_METRICS_DIR") or None
    elif not o.metrics_dir:
        o.metrics_dir = None  # --metrics-dir '': none, even with $HOSTLOCK_METRICS_DIR set
    if not o.history:
        history = os.getenv("HOSTLOCK_HISTORY")
        if history:
            if history != "journal":
                raise c.UsageError("$HOSTLOCK_HISTORY=%s: the one history hostlock keeps is 'journal' (or leave it "
                                   "empty)" % c.quote(history), command)
            o.history = True
    if o.replace:
        why = None  # where there is no single running copy this host's kernel can prove (cli/replace.py)
        if o.fleet is not None:
            why = "not a fleet lock's: its holder may run on another host"
        elif o.path is not None:
            why = "not --path: only a named lock's owner record names the running job"
        elif o.mode == "shared" or o.slots > 1:
            why = "not a shared lock or a semaphore, which have several"
        if why:
            raise c.UsageError("--replace ends the running copy of an exclusive host lock, proven by this host's "
                               "kernel: %s" % why, command)


def make_lock(o: Options, on_lost: Callable[[], None] | None = None) -> RunLock:
    """Build the lock the options name: a PathLock for --path, else the engine's Lock (validates the name:
    InvalidName -> exit 64).

    `on_lost` (fleet locks): called once, from the engine's keep-alive thread, when the lock is lost.
    """
    if o.path is not None:
        from ..host.pathlock import PathLock

        return PathLock(o.path, mode=o.mode, ofd=o.mechanism == "ofd")
    from ..api import Lock

    if o.name is None:  # the parser sets a name whenever --path is absent
        raise c.UsageError("missing lock NAME")
    if o.fleet is not None:
        if o.ttl is None:  # the engine's default lease
            return Lock(o.name, mode=o.mode, slots=o.slots, label=o.label, fleet=o.fleet, on_lost=on_lost)
        return Lock(o.name, mode=o.mode, slots=o.slots, label=o.label, fleet=o.fleet, on_lost=on_lost, ttl=o.ttl)
    return Lock(o.name, mode=o.mode, slots=o.slots, directory=o.directory, mechanism=o.mechanism,
                label=o.label)


def job_of(o: Options, lock: RunLock, out_fd: int | None = None) -> Job:
    """The supervisor's job spec from the options and the lock (decides the process group now).

    A fleet lock has no descriptor for the watcher to keep: the job gets the lock's fence and fleet in
    its environment, is stopped (abort) the moment the engine knows the lock is lost, and the watcher
    kills it when the lease's deadline passes while hostlock is stopped (valid_until). Made before a fleet
    lock is held (run forks the job's process while etcd answers), it lacks the fence: see fence_env().
    """
    fleet = o.fleet is not None
    env = None
    if fleet:
        env = {c.FLEET_ENV: o.fleet or ""}
        if lock.fence is not None:  # not yet held (run's early start): fence_env() is given as the job execs
            env.update(fence_env(lock))
    return Job(o.command, env=env,
               new_group=new_group_for(o.pgroup), out_fd=out_fd, time_limit=o.timeout, kill_after=o.kill_after,
               verbose=o.verbose, say=c.say, lock_fds=lock.descriptors(),
               abort=(lambda: lock.lost) if fleet else None,  # read at each wake-up of the supervisor
               valid_until=(lambda: lock.valid_until) if fleet else None)  # passed on to the watcher as it moves


def fence_env(lock: RunLock) -> dict[str, str]:
    """HOSTLOCK_FENCE for the job of a held fleet lock: its fencing token (docs/fleet.md)."""
    return {"HOSTLOCK_FENCE": str(lock.fence)}


def where(lock: RunLock) -> str:
    """Where a lock lives, for messages: its lock directory, or a fleet lock's etcd key prefix."""
    return lock.path if lock.mechanism == "etcd" else lock.directory


def recorder(lock: RunLock, o: Options, defer: bool = False) -> Callable[[int], None]:
    """The supervisor's on_start: name the job (pid, command line) in the lock's owner record for status.
    `defer`: a fleet lock's record, already naming the job's command, gets its pid 0.1 s later (written by the
    keep-alive thread: Lock.update_record), so that a job shorter than that costs no second write to etcd."""

    def record(pid: int) -> None:
        try:
            lock.update_record(job_pid=pid, job_cmdline=c.join_command(o.command), defer=defer)
        except Exception as exc:  # status would name hostlock instead of the job: say so, keep going
            if o.verbose:
                c.say("cannot record the job's pid in the owner record: %s" % c.describe_error(exc))

    return record


def lost_text(o: Options, lock: RunLock, job: str | None) -> str:
    """"lost lock 'NAME' in URL: <why>; fence 12; job stopped, exit status 5 after 2s": the engine's reason,
    the fence the job was given, and what became of the job."""
    from ..core.errors import LockLost

    if lock.lost:
        why = "lost lock %r in %s: its etcd lease ended" % (o.name, where(lock))
    else:  # the job was stopped before the lease could end (no keep-alive answered for TTL - --kill-after)
        why = ("gave up lock %r in %s: no keep-alive was answered in time to give the job --kill-after %s "
               "before the lease could end" % (o.name, where(lock), c.format_span(o.kill_after)))
    try:
        lock.check()
    except LockLost as exc:
        why = c.describe_error(exc)
    return "%s; fence %s; %s" % (why, lock.fence, "the job was not started" if job is None else "job " + job)
