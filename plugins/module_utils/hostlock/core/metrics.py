"""Prometheus' text formats, and the figures of a lock: what `status --format openmetrics`, `lock_info` and the
job metrics files (`--metrics-dir`, cli/metrics.py) are made of.

A leaf: the text format (0.0.4, which node_exporter's textfile collector reads) and OpenMetrics 1.0 (`# UNIT`,
counters' families named without `_total`, `# EOF`) are rendered here, once; `lock_figures` is the one function
that turns a LockStatus into numbers, so the command line and the Ansible module can never disagree.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Iterable

    from .model import LockStatus

PREFIX = "hostlock_"


def escape_label(value: str) -> str:
    """A label value as both formats quote it: backslash, double quote and newline escaped; text that is no
    UTF-8 (a path lock's bytes) kept visible as \\xNN rather than refused."""
    value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    """A sample value: integers without a fraction, floats as Python's shortest repr (both formats read it)."""
    if value != value:  # NaN (math.isnan would load math for this alone)  # pylint: disable=comparison-with-itself
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2 ** 53:
        return "%d" % value
    return repr(float(value))


def series(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """`name{a="1",b="2"}`: labels in the order given (callers keep it fixed, so a series is one string)."""
    inner = ",".join('%s="%s"' % (k, escape_label(v)) for k, v in labels)
    return "%s{%s}" % (name, inner) if inner else name


class Family:
    """One metric family: its name (a counter's with `_total`), type, unit, help, and samples in order."""

    __slots__ = ("name", "kind", "unit", "help", "samples")

    def __init__(self, name: str, kind: str, help_text: str, unit: str = "") -> None:
        self.name, self.kind, self.unit, self.help = name, kind, unit, help_text
        self.samples: list[tuple[str, float]] = []  # (series, value)

    def add(self, labels: Iterable[tuple[str, str]], value: float) -> None:
        self.samples.append((series(self.name, labels), value))

    def render(self, openmetrics: bool) -> str:
        meta = self.name
        if openmetrics and self.kind == "counter" and meta.endswith("_total"):
            meta = meta[: -len("_total")]  # OpenMetrics names the family, its sample gets the suffix
        text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        out = ["# HELP %s %s\n" % (meta, text), "# TYPE %s %s\n" % (meta, self.kind)]
        if openmetrics and self.unit:
            out.append("# UNIT %s %s\n" % (meta, self.unit))
        out.extend("%s %s\n" % (s, number(v)) for s, v in self.samples)
        return "".join(out)


def render(families: Iterable[Family], openmetrics: bool = False) -> str:
    """The exposition text of `families` (OpenMetrics ends with `# EOF`; the text format has no end marker)."""
    text = "".join(f.render(openmetrics) for f in families)
    return text + "# EOF\n" if openmetrics else text


def lock_figures(st: LockStatus, now: float | None = None) -> dict:
    """The numbers of one lock, right now: live holders (stale ones apart), waiters, slots, and how long the
    oldest live holder has held it (0 when nobody does; None never: a figure is always a number).

    `problem` is 1 when something is wrong at the lock's path or in a holder's record (refused, forged)."""
    now = time.time() if now is None else now
    live = [h for h in st.holders if not h.stale]
    since = [h.acquired_at for h in live if h.acquired_at]
    return {
        "holders": len(live),
        "stale_holders": len(st.holders) - len(live),
        "waiters": st.waiters,
        "slots": st.slots,
        "oldest_hold_seconds": round(max(0.0, now - min(since)), 3) if since else 0.0,
        "problem": 1 if st.problem else 0,
    }


def with_figures(st: LockStatus, now: float | None = None) -> dict:
    """One lock as lock_info returns it (module and action alike): the engine's as_dict() and its `figures`."""
    d = st.as_dict()
    d["figures"] = lock_figures(st, now)
    return d


# The families of `status --format openmetrics`, in order: (figure, metric name, help, unit).
LOCK_FAMILIES = (
    ("holders", "hostlock_lock_holders", "Processes holding the lock now (stale records apart).", ""),
    ("waiters", "hostlock_lock_waiters", "Processes (fleet locks: etcd keys) waiting for the lock now.", ""),
    ("stale_holders", "hostlock_lock_stale_holders",
     "Holder records proven stale (dead owner, ended lease): hostlock break removes them.", ""),
    ("slots", "hostlock_lock_slots", "Slots of the lock (1 unless it is a semaphore).", ""),
    ("oldest_hold_seconds", "hostlock_lock_oldest_hold_seconds",
     "How long the oldest live holder has held the lock (0 when nobody holds it).", "seconds"),
    ("problem", "hostlock_lock_problem",
     "1 when the lock's path was refused (a planted link, FIFO, corrupt file) or a holder's record is forged.", ""),
)


def lock_families(statuses: Iterable[LockStatus], now: float | None = None) -> list[Family]:
    """`status --format openmetrics`'s families: one sample per lock in each (label `lock`)."""
    families = [Family(name, "gauge", help_text, unit) for _key, name, help_text, unit in LOCK_FAMILIES]
    for st in statuses:
        figures = lock_figures(st, now)
        for family, (key, *_rest) in zip(families, LOCK_FAMILIES):
            family.add((("lock", st.name),), figures[key])
    return families
