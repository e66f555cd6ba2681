"""Who may enter a lock: the admission rule, written once for the fleet queue and for check mode's prediction.

A leaf (imports nothing): fleet/lock.py applies it to the keys ahead of a waiter in the queue, and the Ansible
modules' check mode (module_utils/_common.would_acquire) to a lock's live holders. The host mechanisms have the
kernel enforce the same rule (one range per slot, shared and exclusive ranges), so they need no copy of it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Protocol, Sequence, TypeVar

    class Taker(Protocol):
        """A holder or an earlier waiter, as the rule sees it."""

        @property
        def mode(self) -> str:
            """"shared" or "exclusive"."""

        @property
        def slots(self) -> int:
            """The size it takes the lock with: 1, or N for an N-slot semaphore."""

    T = TypeVar("T", bound=Taker)


def blockers(ahead: Sequence[T], mode: str, slots: int) -> list[T]:
    """The takers in `ahead` (holders and earlier waiters, in queue order) that keep out one more taker in `mode`
    with `slots` (empty: it enters).

    - exclusive: anyone ahead;
    - shared: an exclusive taker or a semaphore's ahead (a waiting writer blocks later readers: no writer
      starvation);
    - N slots: N takers ahead of the same N; a taker of another kind or size is waited for whole, never counted
      as one slot (it holds alone, or by its own rule).
    """
    if mode == "shared":
        return [e for e in ahead if e.mode != "shared" or e.slots > 1]
    if slots > 1:
        if any(e.slots != slots for e in ahead):
            return list(ahead)
        return list(ahead) if len(ahead) >= slots else []
    return list(ahead)
