"""Base64 (RFC 4648, standard alphabet, padded) for etcd's JSON gateway, which carries every key and value so.

`binascii`, always: a base64 written by hand, used where binascii is a shared library (pyenv's builds) to spare
its load, bought under 5% of `hostlock run --fleet URL NAME true` (docs/benchmarks.md, "Start-up substitutes"),
and went. Decoding is strict (etcd sends nothing else): characters outside the alphabet, a length that is not a
multiple of four, or padding anywhere but at the end raise ValueError (binascii.Error is one), on every Python:
binascii's own strict_mode is 3.11's, so before it the text is checked here first.
"""

from __future__ import annotations

import binascii
import sys

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def encode(data: bytes) -> bytes:
    """base64 of `data`, padded, without a newline."""
    return binascii.b2a_base64(data, newline=False)


def decode(text: bytes) -> bytes:
    """The bytes `text` encodes; ValueError if it is not strict, padded base64."""
    if len(text) % 4:
        raise ValueError("base64 text of %d characters (not a multiple of 4)" % len(text))
    body = text.rstrip(b"=")
    if len(text) - len(body) > 2 or body.translate(None, _ALPHABET):
        raise ValueError("not base64: a character outside its alphabet, or padding not at its end")
    return binascii.a2b_base64(text)


if sys.version_info >= (3, 11):  # binascii's own strict_mode: the same checks, in C

    def decode(text: bytes) -> bytes:  # noqa: F811
        """The bytes `text` encodes; ValueError if it is not strict, padded base64."""
        return binascii.a2b_base64(text, strict_mode=True)


def b64(data: bytes | str) -> str:
    """How the gateway wants a key or value: base64 text (a str is taken as UTF-8)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    """A key or value the gateway sent; b"" for none (an empty value is left out of its JSON)."""
    return decode(text.encode("ascii")) if text else b""
