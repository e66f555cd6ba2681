"""JSON for the etcd gateway's bodies, strict, in Python: `_json` is a shared library on most builds (Debian's
python3 too), 0.2-0.6 ms to load at every start of `hostlock run --fleet`, more than parsing the three small
answers of a run takes here. An answer longer than LONG (a long queue's range) goes to `_json`, loaded then.

Bodies are dicts of str/int/bool/lists: what etcd's gateway sends and what the client writes, nothing else.
Checked against the `json` module by tests/unit/engine/test_wirejson.py.
"""

from __future__ import annotations

LONG = 4096  # characters: from here on `_json` parses faster than its load costs
_SPACE = " \t\n\r"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_QUOTED = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_DIGITS = "0123456789"
_NUMBER = frozenset("0123456789+-.eE")
_DEPTH = 200  # nesting: the gateway's answers have 5 levels; this is a bound against a hostile peer
_scan = None  # _json's scanner, made on the first long answer


def loads(text: str) -> object:
    """json.loads for the gateway's answers; ValueError when `text` is not one JSON value."""
    if len(text) >= LONG:
        return _long(text)
    value, i = _value(text, _skip(text, 0), 0)
    if _skip(text, i) != len(text):
        raise ValueError("extra data after JSON at %d" % i)
    return value


def dumps(value: object) -> str:
    """Compact JSON of a request body (str keys; str, int, bool, None, lists and dicts as values), ASCII only
    as json.dumps(value, separators=(",", ":")) writes it."""
    if isinstance(value, str):
        return quote(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, dict):
        return "{%s}" % ",".join("%s:%s" % (quote(str(k)), dumps(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[%s]" % ",".join(dumps(v) for v in value)
    raise TypeError("cannot send %r as JSON" % (value,))


def quote(text: str) -> str:
    """A JSON string, ASCII only (json.dumps's ensure_ascii)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'  # base64, keys, numbers: nearly every string the client sends
    out = []
    for ch in text:
        if ch in _QUOTED:
            out.append(_QUOTED[ch])
        elif " " <= ch <= "~":
            out.append(ch)
        elif ord(ch) > 0xFFFF:  # a UTF-16 surrogate pair, as json writes it
            n = ord(ch) - 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 | (n >> 10), 0xDC00 | (n & 0x3FF)))
        else:
            out.append("\\u%04x" % ord(ch))
    return '"' + "".join(out) + '"'


def _long(text: str) -> object:
    global _scan
    if _scan is None:
        import _json

        class _Context:
            """What _json.make_scanner reads of json.JSONDecoder: strict JSON, plain dicts and numbers."""

            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = staticmethod(_constant)
            memo: dict = {}

        _scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # duck-typed: the attributes it reads
    i = _skip(text, 0)
    try:
        value, end = _scan(text, i)
    except StopIteration:
        raise ValueError("not JSON") from None
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    if _skip(text, end) != len(text):
        raise ValueError("extra data after JSON at %d" % end)
    return value


def _constant(name: str) -> object:
    raise ValueError("not JSON: %s" % name)  # NaN, Infinity: JSON has none, etcd sends none


def _skip(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _SPACE:
        i += 1
    return i


def _value(s: str, i: int, depth: int) -> tuple:
    c = s[i:i + 1]
    if c == '"':
        return _string(s, i + 1)
    if c == "{" or c == "[":
        if depth >= _DEPTH:
            raise ValueError("JSON nested too deep at %d" % i)
        return (_object if c == "{" else _array)(s, i, depth)
    if s.startswith("true", i):
        return True, i + 4
    if s.startswith("false", i):
        return False, i + 5
    if s.startswith("null", i):
        return None, i + 4
    return _number(s, i)


def _object(s: str, i: int, depth: int) -> tuple:
    out: dict = {}
    i = _skip(s, i + 1)
    if s[i:i + 1] == "}":
        return out, i + 1
    while True:
        if s[i:i + 1] != '"':
            raise ValueError("expected a key at %d" % i)
        key, i = _string(s, i + 1)
        i = _skip(s, i)
        if s[i:i + 1] != ":":
            raise ValueError("expected ':' at %d" % i)
        out[key], i = _value(s, _skip(s, i + 1), depth + 1)
        i, done = _after_item(s, i, "}")
        if done:
            return out, i


def _array(s: str, i: int, depth: int) -> tuple:
    items: list = []
    i = _skip(s, i + 1)
    if s[i:i + 1] == "]":
        return items, i + 1
    while True:
        item, i = _value(s, i, depth + 1)
        items.append(item)
        i, done = _after_item(s, i, "]")
        if done:
            return items, i


def _after_item(s: str, i: int, close: str) -> tuple:
    """After an object's or array's item: (index after `close`, True), or (index of the next item, False)."""
    i = _skip(s, i)
    c = s[i:i + 1]
    if c == close:
        return i + 1, True
    if c != ",":
        raise ValueError("expected ',' or '%s' at %d" % (close, i))
    return _skip(s, i + 1), False


def _number(s: str, i: int) -> tuple:
    """-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, as JSON has it (no '+1', '01', '1.' or '.5')."""
    j, n = i, len(s)
    while j < n and s[j] in _NUMBER:
        j += 1
    text = s[i:j]
    whole = 1 if text[:1] == "-" else 0
    k = _digits(text, whole)
    if k == whole or (text[whole] == "0" and k - whole > 1):
        raise ValueError("not JSON at %d" % i)
    real = False
    if text[k:k + 1] == ".":
        start = k + 1
        k = _digits(text, start)
        if k == start:
            raise ValueError("not a JSON number at %d" % i)
        real = True
    if text[k:k + 1] in ("e", "E"):
        start = k + 2 if text[k + 1:k + 2] in ("+", "-") else k + 1
        k = _digits(text, start)
        if k == start:
            raise ValueError("not a JSON number at %d" % i)
        real = True
    if k != len(text):
        raise ValueError("not a JSON number at %d" % i)
    return (float(text) if real else int(text)), j


def _digits(text: str, k: int) -> int:
    """The index after the run of digits that starts at text[k]."""
    while k < len(text) and text[k] in _DIGITS:
        k += 1
    return k


def _string(s: str, i: int) -> tuple:
    """The string whose text starts at s[i] (after its opening quote), and the index after its closing one."""
    j = s.find('"', i)
    if j < 0:
        raise ValueError("unterminated string at %d" % i)
    chunk = s[i:j]
    if "\\" not in chunk:
        _plain(chunk, i)
        return chunk, j + 1
    out = []
    while True:
        j = s.find('"', i)
        k = s.find("\\", i, j) if j >= 0 else -1
        if j < 0:
            raise ValueError("unterminated string at %d" % i)
        if k < 0:
            out.append(_plain(s[i:j], i))
            return "".join(out), j + 1
        out.append(_plain(s[i:k], i))
        e = s[k + 1:k + 2]
        if e == "u":
            code, i = _hex4(s, k + 2), k + 6
            if 0xD800 <= code <= 0xDBFF and s.startswith("\\u", i):  # a pair: one character beyond U+FFFF
                low = _hex4(s, i + 2)
                if 0xDC00 <= low <= 0xDFFF:
                    code, i = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00), i + 6
            out.append(chr(code))
        elif e in _ESCAPES:
            out.append(_ESCAPES[e])
            i = k + 2
        else:
            raise ValueError("invalid escape at %d" % k)


def _plain(text: str, at: int) -> str:
    """`text`, refused if it holds a control character (strict JSON: they must be escaped)."""
    if not text.isprintable() and any(ch < " " for ch in text):
        raise ValueError("control character in a string at %d" % at)
    return text


def _hex4(s: str, i: int) -> int:
    digits = s[i:i + 4]
    if len(digits) != 4 or not all(ch in "0123456789abcdefABCDEF" for ch in digits):
        raise ValueError("invalid \\u escape at %d" % i)
    return int(digits, 16)
