"""The pure parts of issue 41's metrics and history: the text formats (core/metrics.py), a job file's round trip
(cli/metrics.py), the journal's datagram and what history makes of an entry (cli/journal.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hostlock.cli import journal, metrics
from hostlock.core import metrics as fmt
from hostlock.core.model import LockStatus


def test_label_values_are_escaped_as_both_formats_say():
    assert fmt.series("m", (("lock", 'a"b\\c\nd'),)) == 'm{lock="a\\"b\\\\c\\nd"}'
    assert fmt.escape_label("x\udcff") == "x\\\\udcff"  # a path's stray byte: visible, never refused
    assert fmt.number(3.0) == "3" and fmt.number(0.25) == "0.25" and fmt.number(float("nan")) == "NaN"
    assert fmt.number(float("inf")) == "+Inf"


def test_openmetrics_names_a_counters_family_without_total_and_ends_with_eof():
    f = fmt.Family("hostlock_job_runs_total", "counter", "Runs.\nof it")
    f.add((("job", "j"),), 2)
    g = fmt.Family("hostlock_lock_oldest_hold_seconds", "gauge", "Age.", "seconds")
    g.add((), 1.5)
    om = fmt.render([f, g], openmetrics=True)
    assert om.splitlines() == [
        "# HELP hostlock_job_runs Runs.\\nof it", "# TYPE hostlock_job_runs counter",
        'hostlock_job_runs_total{job="j"} 2',
        "# HELP hostlock_lock_oldest_hold_seconds Age.", "# TYPE hostlock_lock_oldest_hold_seconds gauge",
        "# UNIT hostlock_lock_oldest_hold_seconds seconds", "hostlock_lock_oldest_hold_seconds 1.5", "# EOF"]
    text = fmt.render([f, g])
    assert "# TYPE hostlock_job_runs_total counter" in text and "# UNIT" not in text and "# EOF" not in text


class _H:
    def __init__(self, stale, at):
        self.stale, self.acquired_at, self.problem = stale, at, None


def test_lock_figures_count_live_holders_and_the_oldest_hold():
    st = LockStatus("L", "/d", "/d/L.lock", "ofd", 3, [_H(False, 100.0), _H(False, 90.0), _H(True, 10.0)], 4)
    assert fmt.lock_figures(st, now=130.0) == {"holders": 2, "stale_holders": 1, "waiters": 4, "slots": 3,
                                               "oldest_hold_seconds": 40.0, "problem": 0}
    free = LockStatus("F", "/d", "/d/F.lock", "ofd", 1, [], 0, problem="a symlink")
    assert fmt.lock_figures(free, now=1.0)["oldest_hold_seconds"] == 0.0 and fmt.lock_figures(free)["problem"] == 1


def test_a_job_file_round_trips_and_counts_on():
    values: dict = {}
    metrics._update(values, "j", "ok", "L", 0.5, 1000.0, 2.0, 0, 0)
    text = fmt.render(metrics._families("j", values))
    again = metrics.parse(text)
    assert {k: again[k] for k in values} == {k: float(v) for k, v in values.items()}
    metrics._update(again, "j", "busy", "L2", 0.1, None, None, None, 1)
    got = metrics.parse(fmt.render(metrics._families("j", again)))
    assert got['hostlock_job_runs_total{job="j",result="ok"}'] == 1
    assert got['hostlock_job_runs_total{job="j",result="busy"}'] == 1
    assert got['hostlock_job_runs_total{job="j",result="lost"}'] == 0  # every result from 0
    assert got['hostlock_job_replaced_total{job="j"}'] == 1
    assert got['hostlock_job_last_start_timestamp_seconds{job="j"}'] == 1000.0  # a skipped run did not start it
    assert 'hostlock_lock_last_wait_seconds{job="j",lock="L"}' not in got  # the job's current lock only
    assert got['hostlock_lock_last_wait_seconds{job="j",lock="L2"}'] == 0.1
    fresh = metrics.parse(fmt.render(metrics._families("k", {})))
    assert fresh['hostlock_job_last_success_timestamp_seconds{job="k"}'] == 0  # never
    assert 'hostlock_job_last_exit_code{job="k"}' not in fresh  # nothing ran yet


@given(st.text(max_size=200))
def test_parse_never_raises(text):
    metrics.parse(text)


def test_the_datagram_sends_a_value_with_a_newline_with_its_length():
    data = journal.encode({"MESSAGE": "two\nlines", "HOSTLOCK_LOCK": "L", "SKIPPED": None})
    assert data == b"MESSAGE\n" + (9).to_bytes(8, "little") + b"two\nlines\nHOSTLOCK_LOCK=L\n"


def test_history_names_the_sender_from_journald_and_marks_a_forgery():
    honest = journal.event({"_UID": "0", "_PID": "12", "HOSTLOCK_UID": "0", "HOSTLOCK_EVENT": "acquired",
                            "HOSTLOCK_LOCK": "L", "__REALTIME_TIMESTAMP": "1700000000000000",
                            "HOSTLOCK_WAIT_SECONDS": "0.25"})
    assert honest["uid"] == 0 and honest["pid"] == 12 and not honest["forged"] and honest["wait"] == 0.25
    assert honest["time"] == 1700000000.0
    forged = journal.event({"_UID": "65534", "HOSTLOCK_UID": ["0", "65534"], "HOSTLOCK_EVENT": "released"})
    assert forged["uid"] == 65534 and forged["claimed_uid"] == 0 and forged["forged"]
    nobody = journal.event({"HOSTLOCK_UID": "0"})  # no _UID: the sender is unknown
    assert nobody["forged"] and nobody["uid"] is None
    odd = journal.event({"_UID": "x", "HOSTLOCK_WAIT_SECONDS": "nan", "MESSAGE": [104, 105]})
    assert odd["uid"] is None and odd["wait"] is None
