"""Text another user wrote, made safe to print: one line, inert on any terminal.

A command line, label, file name or owner record can hold newlines and escape sequences (clear the screen,
forge a status row). Every place that shows such text (the command line's tables and messages, the
modules' and the callback's messages) goes through one_line(); a leaf module, so modules shipped to a
managed host can use it without the command line's code.
"""

from __future__ import annotations

# Control characters (C0, DEL and C1, which some terminals take as escapes: 0x9b is CSI), each shown as its
# \\xNN escape; and the bidirectional controls (U+202E and kin), which reorder what follows them on the line
# (a forged name or status row), as \\uNNNN.
CONTROL = {i: "\\x%02x" % i for i in (*range(32), *range(127, 160))}
CONTROL.update({i: "\\u%04x" % i for i in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def one_line(text: str) -> str:
    """`text` with its control characters escaped (\\x0a): what we print stays one line per line we mean, on
    any terminal, whatever a command line, label or file name holds."""
    return text.translate(CONTROL)


_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")
_C_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def quote(arg: str) -> str:
    """Shell-quote one word (what shlex.quote does, without importing re), always on one line: a word with a
    control character (a newline) becomes $'...' with C escapes, as GNU ls shows such names, so a message
    or a status line stays one line and still pastes back into bash, zsh or ksh."""
    if arg and all(c in _SAFE for c in arg):
        return arg
    if any(ord(c) in CONTROL for c in arg):
        return "$'" + "".join(_C_ESCAPES.get(c) or CONTROL.get(ord(c), c) for c in arg) + "'"
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def join_command(argv: list[str]) -> str:
    """A command line a person can paste back into a shell: shown by status and in cron reports."""
    return " ".join(quote(a) for a in argv)
