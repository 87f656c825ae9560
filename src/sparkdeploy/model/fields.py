"""Reading a YAML mapping field by field, as the inventory and the profiles are read: typed getters whose errors
name the file and the field path (`nodes[1].data_ip`) and say what was expected, unknown keys refused with a
did-you-mean, no control characters in any string (values reach shell and unit text)."""

from __future__ import annotations

import re
from typing import Any

from sparkdeploy.errors import InventoryError

# C0 and C1 controls and the Unicode line/paragraph separators: NEL (U+0085), U+2028 and U+2029 end a line for
# Python's str.splitlines and other readers, so a value holding one would split an env or unit line.
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class Fields:
    """A mapping read field by field; remembers the path for messages and rejects keys never read."""

    def __init__(self, data: Any, path: str, file: str, *, allowed: tuple[str, ...]):
        self.file, self.path = file, path
        if not isinstance(data, dict):
            self.fail("", f"expected a mapping, got {kind_of(data)}")
        for key in data:
            if not isinstance(key, str):
                self.fail("", f"keys must be strings, got {key!r}")
            if key not in allowed:
                hint = suggest(key, allowed)
                self.fail(key, f"unknown key{hint}; allowed: {', '.join(allowed)}")
        self.data = data

    def at(self, key: str) -> str:
        if not key:
            return self.path or "(top level)"
        if key.startswith("["):
            return f"{self.path}{key}"
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> None:
        raise InventoryError(message, file=self.file, field=self.at(key))

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def get(self, key: str, kind: type | tuple, default: Any = ..., *, what: str | None = None) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                self.fail(key, f"missing; expected {what or kind_name(kind)}")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            self.fail(key, f"expected {what or kind_name(kind)}, got a boolean ({value!r})")
        if float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            self.fail(key, f"expected {what or kind_name(kind)}, got {kind_of(value)} ({short(value)})")
        if isinstance(value, str) and CONTROL_RE.search(value):
            self.fail(key, "control characters (newline, tab, NUL...) are not allowed")
        return value

    def text(self, key: str, pattern: re.Pattern | None = None, default: Any = ..., *, what: str = "a string") -> Any:
        value = self.get(key, str, default, what=what)
        if value is default and default is not ...:
            return value
        if not value:
            self.fail(key, f"must not be empty; expected {what}")
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(key, f"{short(value)} is not {what}")
        return value

    def integer(self, key: str, lo: int, hi: int, default: Any = ..., *, what: str | None = None) -> Any:
        value = self.get(key, int, default, what=what or f"an integer {lo}..{hi}")
        if value is default and default is not ...:
            return value
        if not lo <= value <= hi:
            self.fail(key, f"{value} out of range; expected {what or f'an integer {lo}..{hi}'}")
        return value

    def number(self, key: str, lo: float, hi: float, default: Any = ..., *, what: str) -> Any:
        value = self.get(key, float, default, what=what)
        if value is default and default is not ...:
            return value
        if not lo <= value <= hi:
            self.fail(key, f"{value} out of range; expected {what}")
        return value

    def items(self, key: str, most: int, default: Any = ..., *, what: str) -> Any:
        """A list of at most `most` entries (checks over a list then stay cheap, whatever the file holds)."""
        value = self.get(key, list, default, what=what)
        if isinstance(value, list) and len(value) > most:
            self.fail(key, f"{len(value)} entries; expected {what}, at most {most}")
        return value

    def flag(self, key: str, default: Any = ...) -> Any:
        return self.get(key, bool, default, what="true or false")

    def sub(self, key: str, allowed: tuple[str, ...], *, required: bool = True) -> "Fields":
        if not self.has(key):
            if required:
                self.fail(key, f"missing; expected a mapping with keys {', '.join(allowed)}")
            return Fields({}, self.at(key), self.file, allowed=allowed)
        return Fields(self.data[key], self.at(key), self.file, allowed=allowed)


def kind_of(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "a boolean", type(None): "nothing"}.get(type(value), type(value).__name__)


def kind_name(kind: type | tuple) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({str: "a string", int: "an integer", float: "a number", bool: "true or false",
                        list: "a list", dict: "a mapping"}.get(k, k.__name__) for k in kinds)


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def suggest(key: str, allowed: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def path_text(f: Fields, key: str, default: Any = ..., *, absolute: bool = False, mount: bool = False) -> Any:
    value = f.text(key, None, default, what="an absolute path" if absolute else "a path")
    if value is default and default is not ...:
        return value
    if absolute and not value.startswith("/"):
        f.fail(key, f"{value!r} is not an absolute path")
    if mount and any(ch in value for ch in ":,"):
        f.fail(key, f"{value!r}: a path mounted into the container cannot contain ':' or ','")
    return value
