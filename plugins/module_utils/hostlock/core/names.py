"""Lock names and durations: validated once, at the edge, so paths built from them are always safe."""

from __future__ import annotations

import _thread

from .errors import InvalidDuration, InvalidName

# No `math` here: it is a shared library on many builds of Python (one more dlopen in every command's start).
# Ranges are checked as what holds for a good value: NaN fails every comparison, so it falls through to the
# refusal, as math.isnan() made it.
_INF = float("inf")

MAX_NAME_LENGTH = 100
# The most slots a semaphore may have (host/kernel.py gives each slot a lock range of its own); here, so
# that checking a Lock's arguments loads no host mechanism.
MAX_SLOTS = 1024
_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_REST = _FIRST | frozenset(".+@-")
NAME_RULE = "1-100 characters from A-Z a-z 0-9 _ . + @ -, not starting with . + @ or -"


def name_chars(text: str, replacement: str = "_") -> str:
    """`text` with each character a lock name may not hold replaced: for names derived from other text (a
    cron job's program, an inventory host), which must follow the rule validate_name checks."""
    return "".join(c if c in _REST else replacement for c in text)


def validate_name(name: object) -> str:
    """Return `name` if it is a safe lock name; the rule keeps names usable as file names ('/', '..', NUL)."""
    if not isinstance(name, str):
        raise InvalidName("lock name must be a string, got %s" % type(name).__name__)
    if not name:
        raise InvalidName("lock name is empty: use " + NAME_RULE)
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName("lock name is %d characters long: use %s" % (len(name), NAME_RULE))
    if name[0] not in _FIRST or not all(c in _REST for c in name):
        bad = next((c for c in name if c not in _REST), name[0])
        raise InvalidName("invalid lock name %r (character %r): use %s" % (name, bad, NAME_RULE))
    return name


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_UNIT_ORDER = ("d", "h", "m", "s", "ms")  # largest first: each at most once, in this order
_UNIT_LETTERS = frozenset("dhms")
_DURATION_HELP = "use seconds (1.5) or units like 250ms, 30s, 5m, 1h30m, 2d, each unit once, largest first"
# The shortest positive duration (a lease, a TTL): anything shorter is over before its token is read.
MIN_POSITIVE = 0.001

# The longest duration hostlock accepts anywhere (leases, timeouts, --kill-after): the longest single wait
# every primitive we sleep in can honour in one call. poll()/epoll_wait() take an int of milliseconds
# (2**31-1 ms, 24.8 days; Python raises OverflowError past it), the tightest limit; thread-lock waits
# (threading.TIMEOUT_MAX, 292 years on Linux), sigtimedwait()'s timespec and time_t all reach further.
# Node's setTimeout has the same ceiling. Longer needs are served by renewing a lease or waiting forever.
MAX_DURATION: float = min((2**31 - 1) / 1000.0, _thread.TIMEOUT_MAX)
_LIMIT_TEXT = "%.3f seconds (%.1f days)" % (MAX_DURATION, int(MAX_DURATION / 8640) / 10)  # 24.8: never over


def check_duration(value: object, what: str = "duration", *, positive: bool = False,
                   limit: float = MAX_DURATION) -> float:
    """`value` as float seconds if finite, >= 0 (> 0 if `positive`) and at most `limit` (MAX_DURATION).

    The one check behind parse_duration, hold()/renew() leases and Lock.acquire(timeout=): refusing what
    the platform cannot honour beats accepting it and failing (or silently giving up) later. A positive
    duration (a lease) is at least MIN_POSITIVE: a lease of 1e-7 s would be over before its token is read.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidDuration("%s must be a number of seconds, not %r" % (what, value))
    try:
        seconds = float(value)
    except OverflowError:  # an int too big for a float
        seconds = _INF
    return _in_range(seconds, value, what, positive, limit)


def _in_range(seconds: float, shown: object, what: str, positive: bool, limit: float) -> float:
    if seconds > limit:
        raise InvalidDuration("%s %r is too long: at most %s" % (what, shown, _limit_text(limit)))
    if positive and 0 < seconds < MIN_POSITIVE:
        raise InvalidDuration("%s %r is too short: at least %g seconds" % (what, shown, MIN_POSITIVE))
    if seconds > 0 or (seconds == 0 and not positive):
        return seconds + 0.0  # never -0.0
    raise InvalidDuration("invalid %s %r: must be a number of seconds %s"
                          % (what, shown, "> 0" if positive else ">= 0"))  # < 0, NaN


def _limit_text(limit: float) -> str:
    return _LIMIT_TEXT if limit == MAX_DURATION else "%.0f days" % (limit / 86400)


def parse_duration(text: object, what: str = "duration", *, limit: float = MAX_DURATION,
                   positive: bool = False) -> float:
    """Seconds from '90', '1.5', '250ms', '1h30m' or '2d'; plain numbers are seconds, like flock -w.

    Refuses NaN, infinities, signs (so '-0' too), a unit given twice or out of order ('1h1h', '5m1h'), a
    number too small to be told from 0 ('1e-400'), 0 if `positive` (a lease) and anything over `limit`
    (InvalidDuration, a ValueError). The default limit is what every wait can honour; an age (gc's
    --older-than) is no wait and may be longer.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return check_duration(text, what, limit=limit, positive=positive)
    value = _seconds(text.strip().lower()) if isinstance(text, str) and text.isascii() else None
    if value is None:
        # float() reads any script's digits ('1\u0663' is 13.0), '1_0' as 10, '-0', 'nan' and 'inf': a
        # duration is written in plain ASCII digits and units, or refused.
        raw = text.strip() if isinstance(text, str) else str(text)
        shown = raw.lower() if isinstance(text, str) else ""
        if shown.lstrip("+-") in ("inf", "infinity") and not shown.startswith("-"):
            raise InvalidDuration("%s %r is too long: at most %s" % (what, raw, _limit_text(limit)))
        if shown.startswith("-") or shown.lstrip("+") == "nan":
            raise InvalidDuration("invalid %s %r: must be a number of seconds %s, without a sign"
                                  % (what, raw, "> 0" if positive else ">= 0"))
        raise InvalidDuration("invalid %s %r: %s" % (what, text, _DURATION_HELP))
    if value < 0:
        raise InvalidDuration("invalid %s %r: too small to be told from 0" % (what, text))  # 1e-400
    return _in_range(value, str(text).strip(), what, positive, limit)


def _number(s: str, exponent: bool) -> float | None:
    """A plain decimal (ASCII digits and one '.', with an exponent where allowed) as float; None if not one;
    -1.0 if it has a digit other than 0 yet reads as 0 (it underflowed: '1e-400' is no zero)."""
    mantissa, e, power = s.partition("e") if exponent else (s, "", "")
    whole, _dot, frac = mantissa.partition(".")
    if not (whole + frac) or not (whole + frac).isdigit() or (e and not power.lstrip("+-").isdigit()) \
            or power[1:2] in ("+", "-"):
        return None
    value = float(s)
    return -1.0 if value == 0 and (whole + frac).strip("0") else value


def _seconds(s: str) -> float | None:
    """The seconds `s` says (units each at most once, largest first, as a clock reads: '1h30m', never '1h1h'
    or '30m1h'), None when it is not a duration, -1.0 for one that underflowed."""
    if not s or s[0] in "+-":
        return None
    if s[-1] not in _UNIT_LETTERS:
        return _number(s, True)
    value, rank, number = 0.0, -1, ""
    i = 0
    while i < len(s):
        c = s[i]
        if c in _UNIT_LETTERS:
            unit = "ms" if s.startswith("ms", i) else c
            got = _number(number, False) if number else None
            if got is None or _UNIT_ORDER.index(unit) <= rank:
                return None
            if got < 0:
                return -1.0
            value += got * _UNITS[unit]
            rank, number = _UNIT_ORDER.index(unit), ""
            i += len(unit)
        else:
            number += c
            i += 1
    return None if number else value


def parse_count(text: object, what: str, high: int) -> int:
    """A whole number from 1 to `high`, written in plain ASCII digits: no sign, space, '_' or other script.

    int() reads ' 3', '1_0' (as 10) and '\u0663' (as 3): a count is what a person types, or refused, as a
    duration is (parse_duration).
    """
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or not 1 <= int(text) <= high:
        raise ValueError("invalid %s %r: use a whole number from 1 to %d" % (what, text, high))
    return int(text)
