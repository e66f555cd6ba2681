"""`hostlock history [NAME]`: what happened to a lock (acquired, released, busy, timed out, replaced, broken, lost),
who did it and when, from the system journal (cli/journal.py says why there and what is trusted).

Not on any lock's path: argparse and json are fine here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

from . import common as c
from .admin import _age, _parser, _print_json
from .journal import SOCKET, event, query

SCHEMA = "hostlock.history/1"
JOURNALCTL = ("/usr/bin/journalctl", "/bin/journalctl")


def _build() -> argparse.ArgumentParser:
    p = _parser("history", "What happened to lock NAME (or every lock): acquired (with the wait), released (with "
                "the hold and the job's result), busy, timeout (a wait that ran out), replaced, broken, lost; who "
                "(the sender's uid and pid, as the kernel told the journal; the job, its pid, the label) and when. "
                "Runs record their events with --history; break records its own. Read from the system journal.")
    p.add_argument("name", nargs="?", metavar="NAME", help="the lock (default: every lock)")
    p.add_argument("--since", type=_age, metavar="DURATION", help="only events of the last DURATION (e.g. 12h, 7d)")
    p.add_argument("-n", "--lines", type=_lines, default=100, metavar="N",
                   help="at most the last N events (default 100)")
    p.add_argument("--user", metavar="USER", help="only events sent by USER (a name or a uid), as the kernel says")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in docs/cli.md)")
    return p


def _lines(text: str) -> int:
    n = c.decimal_arg(text)
    if n is None or not 1 <= n <= 100000:
        raise argparse.ArgumentTypeError("invalid count %r: use 1 to 100000" % text)
    return n


def _uid(user: str) -> int:
    n = c.decimal_arg(user)
    if n is not None and n >= 0:
        return n
    try:
        import pwd

        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise c.UsageError("--user: no user %s" % c.quote(user)) from None


def main_history(args: list[str]) -> int:
    """history: the events, or {"schema", "events": [...]}; 69 on a host without journalctl."""
    try:
        ns = _build().parse_args(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else c.EX_USAGE
    try:
        if ns.name:
            from ..core.names import validate_name

            validate_name(ns.name)
        uid = _uid(ns.user) if ns.user is not None else None
    except (c.UsageError, ValueError) as exc:
        return c.usage_error(str(exc), "history")
    journalctl = next((p for p in JOURNALCTL if os.access(p, os.X_OK)), None) or shutil.which("journalctl")
    if journalctl is None:
        c.say("history: no system journal here (journalctl not found): hostlock keeps a lock's history in "
              "systemd-journald's journal (docs/howto-history.md)")
        return c.EX_UNAVAILABLE
    since = time.time() - ns.since if ns.since is not None else None
    try:
        events = [event(e) for e in query(journalctl, ns.name, since, ns.lines, uid)]
    except OSError as exc:
        c.say("history: %s" % c.describe_error(exc))
        return c.EX_UNAVAILABLE
    if not os.path.exists(SOCKET):
        c.say("history: note: systemd-journald is not running here (no %s): nothing new is recorded" % SOCKET)
    if ns.json:
        _print_json({"schema": SCHEMA, "name": ns.name, "events": events})
        return 0
    c.write_out(table(events) if events else "no events%s\n" % (" of lock %s" % ns.name if ns.name else ""))
    return 0


def _detail(e: dict) -> str:
    parts = []
    if e["wait"] is not None:
        parts.append("waited %s" % c.format_span(e["wait"]))
    if e["hold"] is not None:
        parts.append("held %s" % c.format_span(e["hold"]))
    if e["result"]:
        parts.append("%s (exit %s)" % (e["result"], e["exit_status"]) if e["exit_status"] is not None else e["result"])
    if e["holder_pid"] is not None:
        parts.append("holder pid %s%s" % (e["holder_pid"], " (job pid %s)" % e["holder_job_pid"]
                                          if e["holder_job_pid"] is not None else ""))
    if e["job_pid"] is not None:
        parts.append("job pid %s" % e["job_pid"])
    if e["label"]:
        parts.append("label %s" % e["label"])
    if e["forged"]:
        parts.insert(0, "FORGED: claims uid %s, sent by %s" % (
            e["claimed_uid"], "uid %s" % e["uid"] if e["uid"] is not None else "an unknown sender"))
    return ", ".join(parts)


def table(events: list[dict]) -> str:
    """One row per event, oldest first; USER and PID are the sender's as the kernel told journald."""
    rows = [["TIME", "LOCK", "EVENT", "USER", "PID", "JOB", "DETAIL"]]
    for e in events:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])) if e["time"] else "?"
        rows.append([when, e["lock"] or "?", e["event"] or "?",
                     e["user"] or (str(e["uid"]) if e["uid"] is not None else "?"),
                     str(e["pid"]) if e["pid"] is not None else "?", e["job"] or "-", _detail(e)])
    rows = [[c.one_line(cell) for cell in r] for r in rows]  # entries are text their senders chose
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(r[k].ljust(widths[k]) for k in range(len(r) - 1)) + "  " + r[-1] for r in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"
