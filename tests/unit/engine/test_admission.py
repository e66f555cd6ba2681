"""The admission rule (core/admission.py) that the fleet queue and check mode's prediction share."""

from collections import namedtuple

from hostlock.core.admission import blockers

T = namedtuple("T", "mode slots")
EXCL, SHARED, SEM3 = T("exclusive", 1), T("shared", 1), T("exclusive", 3)


def test_exclusive_waits_for_anyone_ahead():
    assert blockers([], "exclusive", 1) == []
    assert blockers([SHARED], "exclusive", 1) == [SHARED]


def test_shared_waits_for_writers_and_semaphores_only():
    assert blockers([SHARED, SHARED], "shared", 1) == []
    assert blockers([SHARED, EXCL, SEM3], "shared", 1) == [EXCL, SEM3]


def test_slots_count_takers_of_the_same_size_and_wait_for_others_whole():
    assert blockers([SEM3, SEM3], "exclusive", 3) == []
    assert blockers([SEM3] * 3, "exclusive", 3) == [SEM3] * 3
    assert blockers([SEM3, EXCL], "exclusive", 3) == [SEM3, EXCL]
    assert blockers([SHARED], "exclusive", 3) == [SHARED]
