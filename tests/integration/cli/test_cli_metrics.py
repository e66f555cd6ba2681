"""`run`/`cron --metrics-dir` against the real thing (issue 41): a real prometheus-node-exporter reads the directory
with its textfile collector and is scraped over loopback, `promtool check metrics` lints what it serves and what
`status --format openmetrics` prints; counters survive runs, concurrent runs lose none, and a directory or file
another user could have planted is refused before the job runs.

The Debian packages come from `make test-cli` (mk/cli.mk's metrics-deps); without them these tests skip.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from cli_support import wait_until
from engine_helpers import NOBODY, needs_users
from ports import free_port

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
PROMTOOL = shutil.which("promtool")
needs_exporter = pytest.mark.skipif(not (NODE_EXPORTER and PROMTOOL),
                                    reason="prometheus-node-exporter and promtool (Debian prometheus) not installed "
                                    "(make test-cli installs them)")


class Exporter:
    """A real node_exporter with only its textfile collector, on a free loopback port."""

    def __init__(self, directory: str, log: str) -> None:
        for _attempt in range(5):  # the port is free when chosen; another test may take it before we bind
            self.port = free_port()
            self.proc = subprocess.Popen(
                [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                 "--collector.textfile.directory=" + directory, "--web.listen-address=127.0.0.1:%d" % self.port],
                stdout=subprocess.DEVNULL, stderr=open(log, "w"))
            try:
                wait_until(lambda: self._answers() or self.proc.poll() is not None, 20, "node_exporter listening")
            except AssertionError:
                self.stop()
                raise
            if self.proc.poll() is None:
                return
        raise AssertionError("node_exporter did not start: %s" % open(log).read())

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def scrape(self) -> str:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def metrics(tmp_path):
    d = tmp_path / "metrics"
    d.mkdir(mode=0o755)
    return d


def samples(text: str) -> dict:
    """series -> value of an exposition text's hostlock samples."""
    out = {}
    for line in text.splitlines():
        if line.startswith("hostlock_"):
            name, _sp, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def promtool(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60,
                          check=False)


@needs_exporter
def test_node_exporter_serves_each_result_and_promtool_accepts_it(cli, metrics, tmp_path):
    m = str(metrics)
    assert cli.run("cron", "--name", "backup", "--metrics-dir", m, "--", "true").returncode == 0
    assert cli.run("cron", "--name", "backup", "--metrics-dir", m, "--", "false").returncode == 1
    assert cli.run("cron", "--name", "backup", "--metrics-dir", m, "--time-limit", "0.2", "--",
                   "sleep", "30").returncode == 124
    holder = cli.start("run", "backup", "sleep", "60")
    cli.wait_held("backup")
    r = cli.run("cron", "--name", "backup", "--metrics-dir", m, "--", "true")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # a quiet skip, counted
    r = cli.run("run", "-w", "0.1", "--metrics-dir", m, "--job", "report", "backup", "true")  # run: the wait runs out
    assert r.returncode == 75, r.stderr
    os.killpg(holder.pid, 15)
    holder.wait()
    assert cli.run("run", "--metrics-dir", m, "--job", "report", "backup", "true").returncode == 0

    exporter = Exporter(m, str(tmp_path / "node_exporter.log"))
    try:
        text = exporter.scrape()
    finally:
        exporter.stop()
    got = samples(text)
    assert got['hostlock_job_runs_total{job="backup",result="ok"}'] == 1
    assert got['hostlock_job_runs_total{job="backup",result="failed"}'] == 1
    assert got['hostlock_job_runs_total{job="backup",result="timeout"}'] == 1
    assert got['hostlock_job_runs_total{job="backup",result="busy"}'] == 1
    assert got['hostlock_job_runs_total{job="backup",result="lost"}'] == 0
    assert got['hostlock_job_last_exit_code{job="backup"}'] == 124  # the last run that ran: --time-limit
    assert 0.2 <= got['hostlock_job_last_duration_seconds{job="backup"}'] < 30
    assert time.time() - 120 < got['hostlock_job_last_success_timestamp_seconds{job="backup"}'] <= time.time()
    assert got['hostlock_job_last_start_timestamp_seconds{job="backup"}'] >= \
        got['hostlock_job_last_success_timestamp_seconds{job="backup"}']
    assert got['hostlock_job_runs_total{job="report",result="busy"}'] == 1
    assert got['hostlock_job_runs_total{job="report",result="ok"}'] == 1
    assert got['hostlock_job_last_exit_code{job="report"}'] == 0
    assert 0 <= got['hostlock_lock_last_wait_seconds{job="report",lock="backup"}'] < 10
    assert "node_textfile_scrape_error 0" in text, text  # node_exporter read every file without complaint
    assert "# TYPE hostlock_job_runs_total counter" in text and "# TYPE hostlock_job_last_exit_code gauge" in text
    r = promtool(text)
    assert r.returncode == 0, r.stdout + r.stderr
    for f in metrics.glob("*.prom"):
        r = promtool(f.read_text())
        assert r.returncode == 0 and r.stdout == "", (f, r.stdout + r.stderr)  # no lint warning either
        assert oct(f.stat().st_mode & 0o777) == "0o644"  # readable by node_exporter's own user
    assert sorted(p.name for p in metrics.iterdir() if not p.name.startswith(".")) == [
        "hostlock-job-backup.prom", "hostlock-job-report.prom"]  # no temporary file left behind


@needs_exporter
def test_status_openmetrics_counts_holders_waiters_and_hold_age_and_promtool_accepts_it(cli):
    holder = cli.start("run", "--slots", "2", "pool", "sleep", "60")
    cli.wait_held("pool")
    other = cli.start("run", "busy", "sleep", "60")
    cli.wait_held("busy")
    waiter = cli.start("run", "busy", "true")
    wait_until(lambda: cli.status("busy")["waiters"] == 1, 10, "a waiter queued")
    r = cli.run("status", "--format", "openmetrics")
    assert r.returncode == 0, r.stderr
    got = samples(r.stdout)
    assert got['hostlock_lock_holders{lock="pool"}'] == 1 and got['hostlock_lock_slots{lock="pool"}'] == 2
    assert got['hostlock_lock_holders{lock="busy"}'] == 1 and got['hostlock_lock_waiters{lock="busy"}'] == 1
    assert 0 < got['hostlock_lock_oldest_hold_seconds{lock="busy"}'] < 60
    assert got['hostlock_lock_problem{lock="busy"}'] == 0
    assert r.stdout.endswith("# EOF\n") and "# UNIT hostlock_lock_oldest_hold_seconds seconds" in r.stdout
    check = promtool(r.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    one = cli.run("status", "busy", "--format", "openmetrics")
    assert samples(one.stdout) == {k: v for k, v in samples(one.stdout).items() if 'lock="busy"' in k}
    assert cli.run("status", "--json", "--format", "openmetrics").returncode == 64
    for p in (holder, other):
        os.killpg(p.pid, 15)
        p.wait()
    assert waiter.wait(10) == 0


def test_counters_survive_concurrent_runs_of_one_job_and_of_many(cli, metrics):
    """20 runs of job a (a shared lock: all at once, writing the same file) beside 20 of job b: none lost."""
    m = str(metrics)

    def one(job):
        return cli.run("cron", "--name", job, "--shared", "--metrics-dir", m, "--", "true").returncode

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, ["a", "b"] * 20))
    assert codes == [0] * 40
    for job in ("a", "b"):
        got = samples((metrics / ("hostlock-job-%s.prom" % job)).read_text())
        assert got['hostlock_job_runs_total{job="%s",result="ok"}' % job] == 20, got


def test_environment_variable_and_empty_option(cli, metrics):
    env = dict(cli.env, HOSTLOCK_METRICS_DIR=str(metrics))
    assert cli.run("cron", "--name", "envjob", "--", "true", env=env).returncode == 0
    assert (metrics / "hostlock-job-envjob.prom").exists()
    assert cli.run("cron", "--name", "nojob", "--metrics-dir", "", "--", "true", env=env).returncode == 0
    assert not (metrics / "hostlock-job-nojob.prom").exists()  # --metrics-dir '': none, $HOSTLOCK_METRICS_DIR aside
    r = cli.run("run", "--path", str(metrics / "x.lock"), "--metrics-dir", str(metrics), "true")
    assert r.returncode == 64 and "--job NAME" in r.stderr, r.stderr  # a path is no job name
    r = cli.run("run", "--job", "../x", "--metrics-dir", str(metrics), "L", "true")
    assert r.returncode == 64 and "job name" in r.stderr, r.stderr


def _refused(cli, tmp_path, directory, *, exit_code=66, words=""):
    marker = tmp_path / "ran"
    r = cli.run("cron", "--name", "guarded", "--metrics-dir", str(directory), "--", "touch", str(marker))
    assert r.returncode == exit_code, r.stdout + r.stderr
    assert not marker.exists(), "the job ran although its metrics could not be kept"
    assert r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
    return r


def test_missing_or_open_directories_are_refused_before_the_job_runs(cli, tmp_path):
    _refused(cli, tmp_path, tmp_path / "nowhere", words="cannot open metrics directory")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # anyone may replace the files: never trusted
    _refused(cli, tmp_path, open_dir, words="other users can write to it")
    group_dir = tmp_path / "group"
    group_dir.mkdir()
    group_dir.chmod(0o775)
    _refused(cli, tmp_path, group_dir, words="other users can write to it")


@pytest.fixture
def public_tmp():
    """A directory under /tmp every user can reach (pytest's own are 0700): the other user plants things there."""
    import pathlib
    import tempfile

    top = pathlib.Path(tempfile.mkdtemp(prefix="hostlock-metrics-", dir="/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


@needs_users
def test_another_users_directory_link_or_file_is_refused(cli, public_tmp):
    tmp_path = public_tmp
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    _refused(cli, tmp_path, theirs, words="belongs to uid 65534")

    # A sticky directory others may write (as /tmp): the directory itself is fine, but a file another user
    # planted at the job's name is never read, never renamed over, and the job does not run.
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    planted = sticky / "hostlock-job-guarded.prom"
    subprocess.run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", "sh", "-c",
                    'printf "hostlock_job_runs_total{job=\\"guarded\\",result=\\"ok\\"} 1e9\\n" > "$1"', "sh",
                    str(planted)], check=True)
    _refused(cli, tmp_path, sticky, words="another user made it")
    assert planted.read_text().endswith("1e9\n") and planted.stat().st_uid == NOBODY

    # A symlink another user planted in the directory's path (as flock FILE refuses one): refused.
    link = sticky / "metrics-link"
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    subprocess.run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", "ln", "-s", str(real),
                    str(link)], check=True)
    _refused(cli, tmp_path, link, words="a symlink owned by uid 65534")
    assert list(real.iterdir()) == []

    # A link planted at the job's file name in our own directory is refused the same way.
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    os.symlink("/etc/passwd", mine / "hostlock-job-guarded.prom")
    _refused(cli, tmp_path, mine, words="not a plain file")
