# GENERATED from lib/hostlock/_text.py by `make module-utils`: do not edit; edit lib/hostlock instead.
# SPDX-License-Identifier: GPL-3.0-or-later
"""Text another user wrote, made safe to print: one line, inert on any terminal.

A command line, label, file name or owner record can hold newlines and escape sequences (clear the screen,
forge a status row). Every place that shows such text (the command line's tables and messages, the
modules' and the callback's messages) goes through one_line(); a leaf module, so modules shipped to a
managed host can use it without the command line's code.
"""

from __future__ import annotations

# Control characters (C0 and DEL), each shown as its \\xNN escape.
CONTROL = {i: "\\x%02x" % i for i in (*range(32), 127)}


def one_line(text: str) -> str:
    """`text` with its control characters escaped (\\x0a): what we print stays one line per line we mean, on
    any terminal, whatever a command line, label or file name holds."""
    return text.translate(CONTROL)
