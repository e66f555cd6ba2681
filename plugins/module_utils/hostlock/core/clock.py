"""The clock leases and deadlines that must count a stopped or suspended process are measured on."""

from __future__ import annotations

import time

_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


def boottime() -> float:
    """Seconds on CLOCK_BOOTTIME (counts suspend and the time a stopped process did not run), else monotonic."""
    if _CLOCK is not None:
        return time.clock_gettime(_CLOCK)
    return time.monotonic()  # pragma: no cover - non-Linux
