import pytest

import hostlock


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


@pytest.mark.parametrize("text", ["", "x", "5x", "-1", "nan", "inf", "1h30", None, True])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        hostlock.parse_duration(text)
