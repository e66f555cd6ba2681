"""Base64 (RFC 4648, standard alphabet, padded) for etcd's JSON gateway, which carries every key and value so.

Why not always `binascii`: where it is a shared library (a Python built with --enable-shared, as pyenv's),
loading it costs about 0.4 ms of every `hostlock run --fleet` (it brings zlib), a tenth of what separates
the command from `etcdctl lock`. So `binascii` is used where it is built into the interpreter (Debian's,
most distributions'), and otherwise the code below, which does no per-character Python work: the data is cut
into its byte columns by slicing, each column mapped through a 256-byte table (bytes.translate), columns
whose bits do not overlap combined as integers, and the results interleaved by slice assignment; a few
microseconds for a key or an owner record. tests/unit/engine/test_b64.py checks both against each other.

Decoding is strict (etcd sends nothing else): characters outside the alphabet, a length that is not a
multiple of four, or padding anywhere but at the end raise ValueError (as binascii.Error is one).
"""

from __future__ import annotations

import sys

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_BAD = 0xFF  # a byte that is not in the alphabet, in _VALUE


def _each(values: bytes, times: int) -> bytes:
    """Each byte of `values`, `times` times in a row (the tables are built without a loop per byte: this module
    is imported at every start)."""
    out = bytearray(len(values) * times)
    for k in range(times):
        out[k::times] = values
    return bytes(out)


# The tables of bytes.translate, for a byte i: i >> 2, (i & 3) << 4, i >> 4, (i & 15) << 2, i >> 6, i & 63.
_SHR2, _AND3_SHL4 = _each(bytes(range(64)), 4), bytes(range(0, 64, 16)) * 64
_SHR4, _AND15_SHL2 = _each(bytes(range(16)), 16), bytes(range(0, 64, 4)) * 16
_SHR6, _AND63 = _each(bytes(range(4)), 64), bytes(range(64)) * 4
# ... and (i << 2) & 255, (i & 15) << 4, (i & 3) << 6; a value 0-63 -> its character; a character -> its value.
_SHL2, _AND15_SHL4 = bytes(range(0, 256, 4)) * 4, bytes(range(0, 256, 16)) * 16
_AND3_SHL6 = bytes(range(0, 256, 64)) * 64
_CHAR = _ALPHABET * 4
_table = bytearray(bytes((_BAD,)) * 256)
for _first, _last, _value in ((b"A", b"Z", 0), (b"a", b"z", 26), (b"0", b"9", 52), (b"+", b"+", 62), (b"/", b"/", 63)):
    _table[_first[0]:_last[0] + 1] = range(_value, _value + _last[0] - _first[0] + 1)
_VALUE = bytes(_table)
del _table, _first, _last, _value


def _join(left: bytes, right: bytes) -> bytes:
    """Bytewise OR of two equally long strings whose bytes share no bit: their sum as integers (no carry)."""
    return (int.from_bytes(left, "big") + int.from_bytes(right, "big")).to_bytes(len(left), "big")


def encode(data: bytes) -> bytes:
    """base64 of `data`, padded, without a newline."""
    tail = len(data) % 3
    if tail:
        data = data + bytes(3 - tail)
    a, b, c = data[0::3], data[1::3], data[2::3]
    out = bytearray(4 * len(a))
    # Bytes a, b, c are the characters of a >> 2, (a & 3) << 4 | b >> 4, (b & 15) << 2 | c >> 6, c & 63.
    out[0::4] = a.translate(_SHR2)
    out[1::4] = _join(a.translate(_AND3_SHL4), b.translate(_SHR4))
    out[2::4] = _join(b.translate(_AND15_SHL2), c.translate(_SHR6))
    out[3::4] = c.translate(_AND63)
    text = bytes(out).translate(_CHAR)
    return text[:len(text) - 3 + tail] + b"=" * (3 - tail) if tail else text


def decode(text: bytes) -> bytes:
    """The bytes `text` encodes; ValueError if it is not strict, padded base64."""
    if len(text) % 4:
        raise ValueError("base64 text of %d characters (not a multiple of 4)" % len(text))
    pad = len(text) - len(text.rstrip(b"="))
    if pad > 2:
        raise ValueError("base64 text with %d padding characters" % pad)
    values = (text[:len(text) - pad] + b"A" * pad).translate(_VALUE)
    if _BAD in values:
        raise ValueError("not base64: a character outside its alphabet")
    w, x, y, z = values[0::4], values[1::4], values[2::4], values[3::4]
    out = bytearray(3 * len(w))
    # Values w, x, y, z are the bytes w << 2 | x >> 4, (x & 15) << 4 | y >> 2, (y & 3) << 6 | z.
    out[0::3] = _join(w.translate(_SHL2), x.translate(_SHR4))
    out[1::3] = _join(x.translate(_AND15_SHL4), y.translate(_SHR2))
    out[2::3] = _join(y.translate(_AND3_SHL6), z)
    return bytes(out[:len(out) - pad])


_encode, _decode = encode, decode
if "binascii" in sys.builtin_module_names:  # no library to load: C, as fast as it gets
    import binascii

    def _encode(data: bytes) -> bytes:
        return binascii.b2a_base64(data, newline=False)

    if sys.version_info >= (3, 11):  # strict_mode= is 3.11's; before, decode() above (as strict)

        def _decode(text: bytes) -> bytes:
            return binascii.a2b_base64(text, strict_mode=True)


def b64(data: bytes | str) -> str:
    """How the gateway wants a key or value: base64 text (a str is taken as UTF-8)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return _encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    """A key or value the gateway sent; b"" for none (an empty value is left out of its JSON)."""
    return _decode(text.encode("ascii")) if text else b""
