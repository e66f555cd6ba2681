# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the serialize callback of this ansible-playbook process, as its tasks see it.

The callback registers itself here when it loads; the hostlock.core.serialized action reads it. Both run in
this process's memory: the action in a worker that ansible-playbook forks for each task (ansible-core's
multiprocessing context is `fork`), after the callback took the play's locks. No variable, file or
environment a user sets can put a callback here: only the callback's own code, in this run.
"""

from __future__ import annotations

import typing as t


class Serializer(t.Protocol):
    def holds(self, host: str) -> str | None:
        """How this run holds `host` now (a line for the task's result), or None."""

    def check_only(self) -> bool:
        """True while a --check play runs that the callback only reports on (it takes no lock)."""


_active: list[Serializer] = []


def register(callback: Serializer) -> None:
    _active[:] = [callback]


def active() -> Serializer | None:
    return _active[0] if _active else None
