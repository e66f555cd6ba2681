"""The lease token format, host and fleet: what hold prints, what renew and release take, what status shows.

A host lease token is `<id>.<secret>.<uid>` (12 and 32 lowercase hex, and the holder's uid in decimal): the
id is public (status shows it), the secret proves the caller may renew or release, and the uid says whose
process the client may talk to: the kernel reports a socket peer's uid, so a client never sends a request to a
process of anyone else that took the holder's socket name after it ended (docs/security.md, "Leases"). A
token of an older hostlock, without the uid, is the caller's own (or root's). A fleet lease token is
`hostlock-etcd.<lease hex>.<revision>`: etcd's lease id and the key's create revision, which is also the
lock's fencing token.
"""

from __future__ import annotations

from .errors import TokenError

FLEET_PREFIX = "hostlock-etcd."
_HEX = frozenset("0123456789abcdef")


def _shown(token: object) -> object:
    return token if not isinstance(token, str) or len(token) < 80 else token[:80] + "..."


def is_fleet(token: object) -> bool:
    """Whether a token is a fleet lease token (by its prefix; split_fleet says whether it is well formed)."""
    return isinstance(token, str) and token.startswith(FLEET_PREFIX)


def host_token(tid: str, secret: str, uid: int) -> str:
    """The token hold() prints for the holder `uid` runs as."""
    return "%s.%s.%d" % (tid, secret, uid)


def _split(token: object) -> tuple[str, str, int | None]:
    if not isinstance(token, str):
        raise TokenError("lease token must be a string", reason="malformed")
    tid, sep, rest = token.strip().partition(".")
    secret, dot, uid = rest.partition(".")
    if not sep or len(tid) != 12 or len(secret) != 32 or not _HEX.issuperset(tid + secret) or (
            dot and not (uid.isdigit() and uid.isascii() and len(uid) < 11 and int(uid) < 2**32)):
        raise TokenError("malformed lease token %r: expected the token printed by hold (12 hex, '.', 32 hex, "
                         "'.', the holder's uid)" % (_shown(token),), reason="malformed")
    return tid, secret, int(uid) if dot else None


def split_host(token: object) -> tuple[str, str]:
    """(id, secret) of a host lease token; TokenError "malformed" otherwise."""
    return _split(token)[:2]


def token_uid(token: object) -> int | None:
    """The uid of the lease's holder, as its token says; None for an older token without it."""
    return _split(token)[2]


def fleet_token(lease_hex: str, fence: int) -> str:
    return "%s%s.%d" % (FLEET_PREFIX, lease_hex, fence)


def split_fleet(token: object) -> tuple[str, int]:
    """(lease id hex, create revision) of a fleet lease token; TokenError "malformed" otherwise."""
    if is_fleet(token):
        hexid, sep, rev = str(token)[len(FLEET_PREFIX):].strip().partition(".")
        if sep and 0 < len(hexid) <= 16 and _HEX.issuperset(hexid) and rev.isdigit() \
                and rev.isascii() and len(rev) < 20:
            return hexid, int(rev)
    raise TokenError("malformed fleet lease token %r: expected %s<lease hex>.<revision>, as printed by hold"
                     % (_shown(token), FLEET_PREFIX), reason="malformed")


def fence_of(token: object) -> int | None:
    """The fencing token inside a fleet lease token; None when it is not a well-formed one."""
    try:
        return split_fleet(token)[1]
    except TokenError:
        return None


def token_id(token: str) -> str:
    """The public id of a lease token as status shows it (host: its id; fleet: etcd-<lease hex>)."""
    if is_fleet(token):
        return "etcd-" + split_fleet(token)[0]
    return split_host(token)[0]
