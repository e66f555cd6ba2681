# GENERATED from lib/hostlock/_names.py by `make module-utils`: do not edit; edit lib/hostlock instead.
# SPDX-License-Identifier: GPL-3.0-or-later
"""Lock names and durations: validated once, at the edge, so paths built from them are always safe."""

from __future__ import annotations

import math

from ._error import InvalidName

MAX_NAME_LENGTH = 100
_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_REST = _FIRST | frozenset(".+@-")
NAME_RULE = "1-100 characters from A-Z a-z 0-9 _ . + @ -, not starting with . + @ or -"


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
_DURATION_HELP = "use seconds (1.5) or units like 250ms, 30s, 5m, 1h30m, 2d"


def parse_duration(text: object) -> float:
    """Seconds from '90', '1.5', '250ms', '1h30m' or '2d'; plain numbers are seconds, like flock -w."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    elif isinstance(text, str) and text.strip():
        try:
            value = float(text.strip())
        except ValueError:
            value = _with_units(text)
    else:
        raise ValueError("invalid duration %r: %s" % (text, _DURATION_HELP))
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise ValueError("invalid duration %r: must be a finite number of seconds >= 0" % (text,))
    return value


def _with_units(text: str) -> float:
    s = text.strip().lower()
    value, number, i = 0.0, "", 0
    while i < len(s):
        c = s[i]
        if c.isdigit() or c == ".":
            number += c
            i += 1
            continue
        unit = "ms" if s.startswith("ms", i) else c
        if unit not in _UNITS or not number:
            raise ValueError("invalid duration %r: %s" % (text, _DURATION_HELP))
        try:
            value += float(number) * _UNITS[unit]
        except ValueError:
            raise ValueError("invalid duration %r: bad number %r" % (text, number)) from None
        number, i = "", i + len(unit)
    if number:
        raise ValueError("invalid duration %r: number %r has no unit" % (text, number))
    return value
