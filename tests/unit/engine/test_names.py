import pytest

import hostlock
from hostlock.core import names as _names


@pytest.mark.parametrize("name", ["a", "apt", "backup.daily", "x_1", "user@host", "a+b-c", "A" * 100, "_x"])
def test_valid_names(name):
    assert hostlock.validate_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a\0b", "A" * 101, "-x", ".hidden", "a b", "a~b",
                                  "é", "a\nb"])
def test_invalid_names_are_a_clear_value_error(name):
    with pytest.raises(hostlock.InvalidName) as e:
        hostlock.validate_name(name)
    assert isinstance(e.value, ValueError)
    assert "A-Z a-z 0-9" in str(e.value) or "empty" in str(e.value)


def test_lock_refuses_invalid_name_before_touching_disk(lockdir):
    import os

    with pytest.raises(hostlock.InvalidName):
        hostlock.Lock("../escape", directory=lockdir)
    assert not os.path.exists(os.path.join(os.path.dirname(lockdir), "escape.lock"))


@pytest.mark.parametrize("text,seconds", [("90", 90), ("1.5", 1.5), ("250ms", 0.25), ("1h30m", 5400), ("2d", 172800),
                                          ("5m", 300), (3, 3.0), ("0", 0.0)])
def test_durations(text, seconds):
    assert hostlock.parse_duration(text) == pytest.approx(seconds)


# Other scripts' digits (float() reads '1\u0663' as 13) are refused: a duration is written in ASCII.
@pytest.mark.parametrize("text", ["", "x", "5x", "-1", "nan", "inf", "1h30", None, True,
                                  "1\u0663", "\u0665m", "\uff15", "1\u00b2", "1_0", "1_0s"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        hostlock.parse_duration(text)


@pytest.mark.parametrize("text", ["1e10", "1e300", "1e400", "-inf", "25d", "9" * 400 + "d", 2**31, 1e10, 2**1100])
def test_durations_past_the_limit_are_refused_naming_it(text):
    with pytest.raises(hostlock.InvalidDuration) as e:
        hostlock.parse_duration(text)
    assert isinstance(e.value, ValueError)
    assert "%.3f seconds" % hostlock.MAX_DURATION in str(e.value) or "invalid" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_limit_is_what_every_wait_primitive_honours():
    import _thread
    import os
    import select

    assert hostlock.parse_duration(hostlock.MAX_DURATION) == hostlock.MAX_DURATION
    assert hostlock.parse_duration("24d") == 24 * 86400
    assert hostlock.MAX_DURATION <= _thread.TIMEOUT_MAX
    r, w = os.pipe()
    try:
        os.write(w, b"x")  # readable at once: each call returns immediately, or raises if out of range
        ep = select.epoll()
        ep.register(r, select.EPOLLIN)
        assert ep.poll(hostlock.MAX_DURATION)
        p = select.poll()
        p.register(r, select.POLLIN)
        assert p.poll(hostlock.MAX_DURATION * 1000)
        with pytest.raises(OverflowError):  # the next millisecond is what poll cannot take
            ep.poll(hostlock.MAX_DURATION + 0.001)
        ep.close()
    finally:
        os.close(r)
        os.close(w)
    lock = _thread.allocate_lock()
    assert lock.acquire(True, hostlock.MAX_DURATION)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, 1e10, "5", True])
def test_lock_acquire_timeout_is_checked_by_the_same_rule(lockdir, value):
    lock = hostlock.Lock("t", directory=lockdir)
    with pytest.raises(hostlock.InvalidDuration):
        lock.acquire(timeout=value)
    assert not lock.locked
    lock.acquire(timeout=hostlock.MAX_DURATION).release()


@pytest.mark.parametrize("text", ["nan", "inf", "0", "0s", "-1", 0, 0.0, float("nan")])
def test_a_lease_must_be_positive_and_says_so(text):
    with pytest.raises(hostlock.InvalidDuration, match="> 0|too long"):
        hostlock.parse_duration(text, "lease", positive=True)


@pytest.mark.parametrize("text,n", [("1", 1), ("3", 3), ("1024", 1024), ("007", 7)])
def test_counts(text, n):
    assert _names.parse_count(text, "count", 1024) == n


# int() reads all of these: a count is plain ASCII digits, or refused (as -w refuses other scripts' digits).
@pytest.mark.parametrize("text", [" 3", "3 ", "1_0", "\u0663", "+3", "-3", "0", "1025", "", "3.0", "0x3", None, 3])
def test_bad_counts(text):
    with pytest.raises(ValueError, match="whole number from 1 to 1024"):
        _names.parse_count(text, "count", 1024)


# Issue 39 item 11: what float() or a lax unit loop let through. A unit twice or out of order is a typo, a sign
# is never part of a duration (so '-0' is no zero), and a number that underflows to 0 was not written as 0.
@pytest.mark.parametrize("text", ["1h1h", "30m1h", "1s1s", "1ms1s", "5m5m", "1d2d", "-0", "-0s", "+5", "+0", "-0.0",
                                  "1e-400", "0.1e-400", "1e-400s", "1ss", "1mm", "1e", "1e+", "1e+-3", "e5", ".",
                                  "1 h", "1h 30m", "0x10", "1.5.5", "1e3s"])
def test_durations_a_person_did_not_mean(text):
    with pytest.raises(hostlock.InvalidDuration) as e:
        hostlock.parse_duration(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text,seconds", [("1h30m", 5400), ("1d2h3m4s5ms", 93784.005), ("1m5ms", 60.005),
                                          ("1e3", 1000), ("0e-400", 0), ("00", 0), (".5", 0.5), ("1.", 1)])
def test_durations_written_as_a_clock_reads(text, seconds):
    assert hostlock.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["1e-7", "0.0001", "999us", 1e-7, 0.0009])
def test_a_lease_shorter_than_a_millisecond_is_refused(value):
    with pytest.raises(hostlock.InvalidDuration, match="too short|invalid"):
        hostlock.parse_duration(value, "lease", positive=True)
    assert hostlock.parse_duration("1ms", "lease", positive=True) == 0.001
