"""The model every part shares: lock modes, the status/holder JSON schema, LockStatus, and the two seams.

A leaf (imports only core): the host mechanisms (host/), the fleet mechanism (fleet/) and the policy (api)
all speak these types, so none of them needs to import another to describe a lock. The seams are the two
small interfaces the policy calls, each chosen once per Lock: a Locker (one per mechanism: kernel ranges,
owner files, an etcd queue) and a fleet Backend (one per fleet URL scheme: etcd).
"""

from __future__ import annotations

from .errors import LockTimeout

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Callable, Optional, Protocol

    # Whatever a locker's acquire() returned (host.kernel.Held, host.record.RecordHeld, fleet.lock.EtcdHeld):
    # a Lock only ever hands a locker back its own Held (one locker per Lock, chosen once).
    Held = Any
    Builder = Callable[[Optional[int], Optional[int]], bytes]  # (slot, ticket) -> the owner record
    # A caller's work that overlaps a request's round trip (Lock.acquire's `meanwhile`), run once the last
    # request of the acquisition is on its way (fleet.etcd.Client.two_in_turn).
    Meanwhile = Callable[[], None]

    class Locker(Protocol):
        """What a Lock needs of a mechanism (host.lockers' KernelLocker and RecordLocker, fleet.lock.EtcdLocker)."""

        path: str

        def acquire(self, mode: str, fifo: bool, deadline: float | None, record: Builder,
                    meanwhile: Meanwhile | None = None) -> Held | None:
            """Held, with our owner record written, or None once the deadline has passed. `meanwhile()` may be
            called (any number of times: the Lock runs it once) while a request is on its way to a server."""

        def release(self, held: Any) -> None:
            """Nothing of `held` is held any more when this returns."""

        def write_record(self, held: Any, data: bytes, defer: bool = False) -> None:
            """Replace our record. `defer`: a moment later is as good (a fleet lock's keep-alive thread writes it,
            and not at all if the lock is released first); a host lock's is written now either way."""

        def read_record(self, held: Any) -> bytes: ...

        def descriptors(self, held: Any) -> list[int]:
            """Descriptors whose duplicates keep the lock held after we are gone (kernel locks only)."""

        def forget(self, held: Any) -> None:
            """In a forked child: drop everything without releasing (the parent still holds)."""

        def close(self) -> None: ...

    class Backend(Protocol):
        """What a fleet store implements (fleet.lock.EtcdBackend); the policy's module functions call only these."""

        url: Any  # the parsed fleet.url.FleetURL

        def locker(self, name: str, slots: int, ttl: float,
                   on_lost: Callable[[], object] | None) -> Locker: ...

        def status(self, name: str) -> LockStatus: ...

        def busy(self, name: str, timeout: float | None) -> LockTimeout:
            """The LockTimeout of a wait that ran out, from a short read of who holds it (FleetUnavailable if
            the store does not answer it)."""

        def list_locks(self) -> list: ...

        def break_lock(self, name: str, force: bool) -> list: ...

        def hold(self, name: str, lease: float, mode: str, slots: int, label: str | None,
                 timeout: float | None) -> str: ...

        def renew(self, name: str, token: str, lease: float | None) -> float: ...

        def release(self, name: str, token: str) -> None: ...


MODES = ("exclusive", "shared")
# A fleet lock's etcd lease, in seconds, unless told otherwise: kept alive every TTL/3 while held, gone this long
# after its holder (the API's Lock, the command's --ttl and the fleet engine all mean this one).
FLEET_TTL = 10.0
# The host mechanisms (host/: kernel OFD ranges, flock(), owner files) and what a Lock, --mechanism and the
# modules accept. Here, not in host/directory.py, so that checking an argument loads no host mechanism.
MECHANISMS = ("ofd", "flock", "record")
MECHANISM_CHOICES = ("auto", *MECHANISMS)
STATUS_SCHEMA = "hostlock.status/1"  # the version of LockStatus.to_json()/Holder.to_json() (docs/cli.md)


_FLEET = __name__.rsplit(".", 2)[0] + ".fleet"  # hostlock.fleet, wherever hostlock is imported from


def fleet_backend(fleet: str) -> Backend:
    """The fleet Backend for a URL (etcd), loaded only when a fleet is used: host locks never import it. Here,
    with the seam it picks, for the policy (api: Lock) and the read side (queries) alike.

    Loaded by name, not by an import statement: Ansible's module dependency finder follows every import
    statement (those inside functions too) into a module's payload, and fleet code never runs on a managed
    host. tests/unit/test_layout.py keeps every other arrow into fleet/ out of what a host imports.
    """
    # __import__, not importlib.import_module: `import importlib` loads `warnings` too, on every fleet start.
    return __import__(_FLEET, None, None, ("backend",), 0).backend(fleet)


class LockStatus:
    """One lock as seen from outside: who holds it, how many wait, and whether anything is stale.

    `problem` says why its path was refused (a symlink, FIFO or device planted there, a corrupt header),
    or that a holder's record is forged; status reports such a lock instead of leaving it out.
    """

    __slots__ = ("name", "directory", "path", "mechanism", "slots", "holders", "waiters", "stale", "problem",
                 "corrupt")

    def __init__(self, name: str, directory: str, path: str, mechanism: str, slots: int, holders: list,
                 waiters: int, problem: str | None = None, corrupt: bool = False) -> None:
        self.name, self.directory, self.path, self.mechanism = name, directory, path, mechanism
        self.slots, self.holders, self.waiters = slots, holders, waiters
        self.stale = any(h.stale for h in holders)
        self.problem = problem or next((h.problem for h in holders if h.problem), None)
        self.corrupt = corrupt

    @property
    def held(self) -> bool:
        return bool(self.holders)

    @property
    def state(self) -> str:
        """'held' (a holder that is not stale), 'stale', 'refused' (problem at the path), or 'free'."""
        if any(not h.stale for h in self.holders):
            return "held"
        if self.stale or self.holders:
            return "stale"
        return "refused" if self.problem else "free"

    def timed_out(self, timeout: float | None) -> LockTimeout:
        """The one LockTimeout of every wait that gave up (Lock, hold): who held the lock, how many waited."""
        who = "; ".join(h.describe() for h in self.holders) or "another holder"
        return LockTimeout("lock %r in %s is held by %s%s; gave up after %ss" % (
            self.name, self.directory, who, ", %d waiting" % self.waiters if self.waiters else "", timeout),
            holders=self.holders, waiters=self.waiters, path=self.path, directory=self.directory)

    def to_json(self) -> dict:
        """The documented, stable JSON shape of a lock (one entry of hostlock.status/1's "locks")."""
        return {
            "name": self.name,
            "path": self.path,
            "mechanism": self.mechanism,
            "slots": self.slots,
            "state": self.state,
            "stale": bool(self.stale),
            "problem": self.problem,
            "waiters": self.waiters,
            "holders": [h.to_json() for h in self.holders],
        }

    def as_dict(self) -> dict:
        """to_json() plus the engine's extras (directory, held, corrupt; holders' as_dict): one shape."""
        d = self.to_json()
        d.update(directory=self.directory, held=self.held, corrupt=self.corrupt,
                 holders=[h.as_dict() for h in self.holders])
        return d

    def __repr__(self) -> str:
        return "LockStatus(%r, %d holder(s), %d waiting%s)" % (
            self.name, len(self.holders), self.waiters, ", stale" if self.stale else "")
