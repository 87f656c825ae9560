"""How a field of a config file is declared (pydantic) and how its error reads.

The shapes themselves are declared once, in `model/schema.py`, with the leaf types made here: each names what it
expects (`what`), and its own check raises the kit's words (expected what, got what; out of range; not a name).
`read(shape, data, path, file)` validates one mapping and turns pydantic's first error into an `InventoryError`
naming the file and the field path (`nodes[1].data_ip`), with a did-you-mean for an unknown key. A key set to
null counts as absent (its default applies). No string may hold a control character: values reach shell and
unit text.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from typing import Annotated, Any, Callable, Union, get_args, get_origin

from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import ArgsKwargs, PydanticCustomError

from sparkdeploy.errors import InventoryError

# C0 and C1 controls and the Unicode line/paragraph separators: NEL (U+0085), U+2028 and U+2029 end a line for
# Python's str.splitlines and other readers, so a value holding one would split an env or unit line.
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_KIND = "sparkdeploy"  # the error type of the kit's own messages
_UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")


def bad(message: str, at: str = "") -> PydanticCustomError:
    """An error in the kit's words; `at` extends the field path (`[1]`, `.KEY`) below the field that raised it."""
    return PydanticCustomError(_KIND, message, {"at": at} if at else None)


def kind_of(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "a boolean", type(None): "nothing"}.get(type(value), type(value).__name__)


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def suggest(key: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def section(cls: type | None = None, *, kw_only: bool = False) -> Any:
    """A mapping of a config file, declared as a frozen pydantic dataclass: unknown keys refused, a key set to
    null the same as absent (its default applies). `kw_only` lets required keys follow optional ones."""
    def make(cls: type) -> type:
        @model_validator(mode="before")
        @classmethod
        def _mapping(shape: type, data: Any) -> Any:
            if dataclasses.is_dataclass(data) or isinstance(data, ArgsKwargs):  # an instance, or built in code
                return data
            if not isinstance(data, dict):
                raise bad(f"expected a mapping, got {kind_of(data)}")
            for key in data:
                if not isinstance(key, str):
                    raise bad(f"keys must be strings, got {key!r}")
            names = {f.name for f in dataclasses.fields(shape)}
            return {k: v for k, v in data.items() if v is not None or k not in names}

        cls._mapping = _mapping
        return pydantic_dataclass(frozen=True, kw_only=kw_only, config=ConfigDict(extra="forbid"))(cls)

    return make(cls) if cls is not None else make


# ------------------------------------------------------------------------------------------------ leaves
def _typed(value: Any, kinds: tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) and bool not in kinds:
        raise bad(f"expected {what}, got a boolean ({value!r})")
    if float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kinds):
        raise bad(f"expected {what}, got {kind_of(value)} ({short(value)})")
    if isinstance(value, str) and CONTROL_RE.search(value):
        raise bad("control characters (newline, tab, NUL...) are not allowed")
    return value


def leaf(base: Any, kinds: tuple[type, ...], what: str, check: Callable[[Any], None] | None = None,
         **schema: Any) -> Any:
    """A leaf of type `base` that takes values of `kinds`; `check(value)` raises `bad(...)` for the rest;
    `schema`: what its JSON Schema adds (`minimum`, `maximum`)."""
    def validate(value: Any) -> Any:
        value = _typed(value, kinds, what)
        if check is not None:
            check(value)
        return value

    return Annotated[base, BeforeValidator(validate), Field(description=what, json_schema_extra=schema or None)]


def Text(what: str = "a string", pattern: re.Pattern | None = None,
         check: Callable[[str], None] | None = None) -> Any:
    def text_check(value: str) -> None:
        if not value:
            raise bad(f"must not be empty; expected {what}")
        if pattern is not None and not pattern.fullmatch(value):
            raise bad(f"{short(value)} is not {what}")
        if check is not None:
            check(value)

    return leaf(str, (str,), what, text_check)


def OneOf(choices: tuple[str, ...], what: str, says: Callable[[str], str]) -> Any:
    """A string out of `choices`; `says(value)` words the refusal."""
    def check(value: str) -> None:
        if value not in choices:
            raise bad(says(value))

    return Text(what, check=check)


def Int(lo: int, hi: int, what: str | None = None) -> Any:
    what = what or f"an integer {lo}..{hi}"

    def check(value: int) -> None:
        if not lo <= value <= hi:
            raise bad(f"{value} out of range; expected {what}")

    return leaf(int, (int,), what, check, minimum=lo, maximum=hi)


def Num(lo: float, hi: float, what: str) -> Any:
    def check(value: float) -> None:
        if not lo <= value <= hi:
            raise bad(f"{value} out of range; expected {what}")

    return leaf(float, (float,), what, check, minimum=lo, maximum=hi)


Flag = leaf(bool, (bool,), "true or false")


def Items(item: Any, most: int, what: str, check: Callable[[list], None] | None = None) -> Any:
    """A list of at most `most` entries (checks over a list then stay cheap, whatever the file holds)."""
    def list_check(value: list) -> None:
        if len(value) > most:
            raise bad(f"{len(value)} entries; expected {what}, at most {most}")
        if check is not None:
            check(value)

    return leaf(tuple[item, ...], (list, tuple), what, list_check)  # a tuple: built in code


def PathText(*, absolute: bool = False, mount: bool = False, then: Callable[[str], None] | None = None) -> Any:
    """A path; `absolute`, `mount` (the container mounts it: no ':' or ','), then `then`'s own check."""
    what = "an absolute path" if absolute else "a path"

    def check(value: str) -> None:
        if absolute and not value.startswith("/"):
            raise bad(f"{value!r} is not an absolute path")
        if mount and any(ch in value for ch in ":,"):
            raise bad(f"{value!r}: a path mounted into the container cannot contain ':' or ','")
        if then is not None:
            then(value)

    return Text(what, check=check)


# --------------------------------------------------------------------------------------------- reading
def read(shape: Any, data: Any, path: str, file: str) -> Any:
    """`data` validated as `shape` (a `section`); the first error as an InventoryError naming `file` and the
    field path under `path`."""
    try:
        return _adapter(shape).validate_python(data)
    except ValidationError as err:
        errors = err.errors(include_url=False)
        # a misspelt key is also a missing one: name the typo, which says what to fix
        first = next((e for e in errors if e["type"] in _UNKNOWN_KEY), errors[0])
        where, reason = _explain(shape, first)
        raise InventoryError(reason, file=file, field=at(path, where)) from None


_adapter = functools.cache(TypeAdapter)  # a shape's validator is built once per process


def at(path: str, key: str) -> str:
    """`path` extended by `key` (`x`, `[1]` or `x.y`); the top level reads as such."""
    if not key:
        return path or "(top level)"
    if key.startswith("["):
        return f"{path}{key}"
    key = key.removeprefix(".")
    return f"{path}.{key}" if path else key


def _explain(shape: Any, error: dict) -> tuple[str, str]:
    """(the field path below the shape, the reason) of one pydantic error."""
    loc = list(error["loc"])
    kind = error["type"]
    if kind in _UNKNOWN_KEY:
        key, owner = loc[-1], _walk(shape, loc[:-1])
        allowed = tuple(_fields(owner))
        return _loc_text(loc), f"unknown key{suggest(str(key), allowed)}; allowed: {', '.join(allowed)}"
    if kind == "missing":
        target = _walk(shape, loc)
        return _loc_text(loc), f"missing; expected {_what(shape, loc, target)}"
    if kind == _KIND:
        return _loc_text(loc) + (error.get("ctx") or {}).get("at", ""), error["msg"]
    if kind == "invalid_key":
        return _loc_text(loc[:-1]), f"keys must be strings, got {loc[-1]!r}"
    return _loc_text(loc), f"{error['msg']} ({short(error.get('input'))})"


def _loc_text(loc: list) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _fields(shape: Any) -> dict:
    return getattr(_bare(shape), "__pydantic_fields__", None) or {}


def _bare(annotation: Any) -> Any:
    """The type under Annotated and Optional."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin is Union:
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def _walk(shape: Any, loc: list) -> Any:
    """The declared type at `loc` below `shape` (a field, a mapping's value, a list's item)."""
    for part in loc:
        shape = _bare(shape)
        origin = get_origin(shape)
        if part in _fields(shape):
            shape = _fields(shape)[part].annotation
        elif origin is dict:
            shape = get_args(shape)[1]
        elif origin in (tuple, list):
            shape = get_args(shape)[0]
    return _bare(shape)


def _what(shape: Any, loc: list, target: Any) -> str:
    info = _fields(_walk(shape, loc[:-1])).get(loc[-1])
    if info is not None and info.description:
        return info.description
    if _fields(target):
        return f"a mapping with keys {', '.join(_fields(target))}"
    return "a value"
