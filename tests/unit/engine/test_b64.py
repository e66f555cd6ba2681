"""fleet/b64.py: the gateway's base64, checked against the standard library for every length around the padding
cases and for random data, and strict where etcd's answers are concerned, on every Python (binascii's
strict_mode is 3.11's): anything but padded base64 is a ValueError, never bytes made up."""

from __future__ import annotations

import base64
import binascii
import random

import pytest

from hostlock.fleet import b64


def _strict_mode() -> bool:
    """binascii.a2b_base64(strict_mode=) exists (3.11+): the module uses it there."""
    try:
        binascii.a2b_base64(b"", strict_mode=True)
    except TypeError:
        return False
    return True


STRICT_MODE = _strict_mode()


@pytest.mark.parametrize("n", list(range(0, 64)) + [255, 256, 257, 4095, 4096, 65537])
def test_encode_and_decode_match_the_standard_library(n):
    rnd = random.Random(n)
    for _round in range(20):
        data = bytes(rnd.getrandbits(8) for _byte in range(n))
        text = base64.b64encode(data)
        assert b64.encode(data) == text
        assert b64.decode(text) == data
        assert b64.b64(data) == text.decode() and b64.unb64(text.decode()) == data


def test_every_byte_value_in_every_column():
    for shift in range(3):
        data = bytes(shift) + bytes(range(256))
        assert b64.encode(data) == base64.b64encode(data)
        assert b64.decode(base64.b64encode(data)) == data


def test_str_is_taken_as_utf8_and_nothing_is_empty():
    assert b64.b64("h\u00e9") == base64.b64encode("h\u00e9".encode()).decode()
    assert b64.unb64(None) == b"" and b64.unb64("") == b""


@pytest.mark.parametrize("bad", [b"A", b"AB", b"ABC", b"A===", b"====", b"AB=C", b"QQ==QQ==", b"ab!d", b"AB\n=",
                                 b"QUJD\n", b"QU JD", b"-_-_"])
def test_anything_but_padded_base64_is_refused(bad):
    with pytest.raises(ValueError):
        b64.decode(bad)
    with pytest.raises(ValueError):
        b64.unb64(bad.decode())
    if STRICT_MODE:  # what the module uses on 3.11+: as strict
        with pytest.raises(ValueError):
            binascii.a2b_base64(bad, strict_mode=True)


def test_non_ascii_text_is_refused():
    with pytest.raises(ValueError):
        b64.unb64("QU\u00e9D")
