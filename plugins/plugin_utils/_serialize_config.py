# Copyright: (c) 2025, hostlock maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""PRIVATE to this collection: the serialize settings ansible-core drops without a word, named.

ansible-core loads a callback only if `callbacks_enabled` names it (config/base.yml: `[defaults]
callbacks_enabled`, $ANSIBLE_CALLBACKS_ENABLED; the old `callback_whitelist` is read no more, and an
unknown key is not reported), warns once for an entry it cannot load, and reads a plugin's ini options
from their exact section and key only (config/manager.py: a misspelt section or key is never looked at).
So a run meant to be serialized runs unserialized, exit 0. These functions say which setting is missing or
misspelt, in one line: the callback refuses its own misspelt settings when it loads, and the
hostlock.core.serialized task names why the callback is not active.
"""

from __future__ import annotations

import configparser
import difflib
import os
import re
import typing as t

import ansible.constants as C

CALLBACK = "hostlock.core.serialize"
SECTION = "hostlock_serialize"
ENV_PREFIX = "HOSTLOCK_SERIALIZE_"
# Not settings: the in-flight marks every serialized task carries (a controller run inside such a task has them).
MARKS = frozenset(("HOSTLOCK_SERIALIZE_HOST", "HOSTLOCK_SERIALIZE_RUN"))
HOW = f"set callbacks_enabled = {CALLBACK} under [defaults] in ansible.cfg, or ANSIBLE_CALLBACKS_ENABLED={CALLBACK}"


def config_file() -> str | None:
    """The ansible.cfg this run reads (ansible-core keeps its path on its ConfigManager), or None."""
    return getattr(C.config, "_config_file", None) or None


def _parsed(path: str | None) -> configparser.ConfigParser | None:
    """The file as ansible-core parses it (configparser, `;` inline comments), or None."""
    if not path:
        return None
    parser = configparser.ConfigParser(inline_comment_prefixes=(";",))
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_string(f.read())
    except (OSError, UnicodeDecodeError, configparser.Error):
        return None  # ansible-core reported it already, or could not read it either
    return parser


def _like(word: str, target: str) -> bool:
    def flat(s: str) -> str:
        return re.sub(r"[^a-z0-9]", "", s.lower())
    return word != target and (flat(word) == flat(target) or difflib.SequenceMatcher(None, word, target).ratio() >= 0.8)


def setting_mistakes(options: t.Iterable[str], environ: t.Mapping[str, str] | None = None) -> list[str]:
    """Serialize settings given where the callback never reads them: a section spelt unlike [hostlock_serialize],
    a key or a HOSTLOCK_SERIALIZE_* variable that names no option. One line each."""
    environ = os.environ if environ is None else environ
    names = sorted(options)
    path = config_file()
    out = []
    parser = _parsed(path)
    if parser is not None:
        for section in parser.sections():
            if _like(section, SECTION):
                out.append(f"section [{section}] in {path} is not read: the callback reads [{SECTION}]")
        if parser.has_section(SECTION):
            for key in parser.options(SECTION):
                if key not in names and key not in parser.defaults():
                    out.append(f"key {key!r} in [{SECTION}] of {path} names no option{_guess(key, names)}")
    for var in sorted(environ):
        if var.startswith(ENV_PREFIX) and var not in MARKS and var[len(ENV_PREFIX):].lower() not in names:
            out.append(f"environment variable {var} names no option{_guess(var[len(ENV_PREFIX):].lower(), names)}")
    return out


def _guess(word: str, names: list[str]) -> str:
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else f" (the options: {', '.join(names)})"


def why_not_active(environ: t.Mapping[str, str] | None = None) -> str:
    """Why the serialize callback is not loaded in this run, naming the missing or misspelt setting."""
    environ = os.environ if environ is None else environ
    path = config_file()
    try:
        enabled, origin = C.config.get_config_value_and_origin("CALLBACKS_ENABLED")
    except Exception:  # noqa: BLE001 - a diagnosis must never raise; say what we know
        enabled, origin = C.CALLBACKS_ENABLED, "?"
    enabled = [str(e) for e in enabled or []]
    where = f"callbacks_enabled ({origin})"
    if CALLBACK in enabled:
        return (f"{where} names {CALLBACK}, but it did not load in this run: see the 'Skipping callback' "
                "warning above (a broken install, or an option ansible-core could not read)")
    close = [e for e in enabled if difflib.SequenceMatcher(None, e, CALLBACK).ratio() >= 0.7 or "serializ" in e]
    if close:
        return f"{where} names {close[0]!r}, which is no callback: spell it {CALLBACK}"
    for var in ("ANSIBLE_CALLBACK_WHITELIST", "ANSIBLE_CALLBACKS_WHITELIST", "ANSIBLE_CALLBACK_ENABLED"):
        if environ.get(var):
            return f"${var} is not read by ansible-core (it reads ANSIBLE_CALLBACKS_ENABLED): {HOW}"
    parser = _parsed(path)
    if parser is not None:
        for section in parser.sections():
            for key in parser.options(section):
                if key in parser.defaults() and section != "defaults":
                    continue
                if "whitelist" in key and "callback" in key:
                    return (f"{key} in [{section}] of {path} is not read by ansible-core (2.15 removed it): "
                            f"rename it callbacks_enabled, under [defaults]")
                if _like(key, "callbacks_enabled") or (key == "callbacks_enabled" and section != "defaults"):
                    return f"{key} in [{section}] of {path} is not read by ansible-core: {HOW}"
    found = f"config file {path}" if path else "no ansible.cfg found"
    names = ", ".join(enabled) or "empty"
    return f"the {CALLBACK} callback is not enabled in this run ({found}, {where} = {names}): {HOW}"
