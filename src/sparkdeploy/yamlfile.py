"""The one YAML loader for files a user hands the kit (inventory, profile, facts): bounded and strict, so a bad
file is refused whole, fast, with the line to fix.

- only a regular file is read, opened without blocking (a FIFO or a device such as /dev/zero is refused before
  any read: a FIFO would wait for a writer forever), and at most MAX_BYTES of it (a 50 MB file is refused);
- the composed document may hold at most MAX_VALUES values counting every alias expansion (a 3 KB alias bomb
  composes to a few hundred shared nodes but expands to billions: refused before any object is built);
- a key given twice in one mapping is refused with both lines (a second `ports:` would silently win);
- messages quote at most a short prefix of a key, never a value.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from sparkdeploy.errors import InventoryError

MAX_BYTES = 1 << 20
MAX_VALUES = 100_000
_QUOTE = 60  # characters of a key quoted in a message

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(path: Path | str, what: str) -> Any:
    """The document in `path` as plain Python objects, or InventoryError naming the file (and line)."""
    path = Path(path)
    text = _read(path, what)
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as err:
            raise InventoryError(f"YAML syntax error{_where(getattr(err, 'problem_mark', None))}: "
                                 f"{_problem(err)}", file=str(path)) from None
        except RecursionError:
            raise InventoryError("YAML nested too deeply", file=str(path)) from None
        if node is None:
            raise InventoryError(f"{what} is empty", file=str(path))
        _check(node, str(path))
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as err:
            raise InventoryError(f"YAML value not understood{_where(getattr(err, 'problem_mark', None))}: "
                                 f"{_problem(err)}", file=str(path)) from None
    finally:
        loader.dispose()


def read_regular(path: Path, what: str, limit: int) -> bytes:
    """At most `limit` bytes of the regular file `path`; InventoryError naming it for anything else (missing, a
    directory, a FIFO, a device, a name too long, larger than `limit`), without blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InventoryError(f"{what} file not found", file=str(path)) from None
    except OSError as err:
        raise InventoryError(f"cannot read {what}: {err.strerror or err}", file=str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InventoryError(f"{what} is not a regular file (a directory, FIFO or device?)", file=str(path))
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as err:
            raise InventoryError(f"cannot read {what}: {err.strerror or err}", file=str(path)) from None
    if len(data) > limit:
        raise InventoryError(f"{what} is larger than {limit // 1024} KiB; is this the right file?", file=str(path))
    return data


def _read(path: Path, what: str) -> str:
    data = read_regular(path, what, MAX_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise InventoryError(f"not UTF-8 text (line {line})", file=str(path)) from None


def _where(mark) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def _problem(err: yaml.YAMLError) -> str:
    return (getattr(err, "problem", None) or str(err).splitlines()[0])[:200]


def _check(root: yaml.Node, file: str) -> None:
    """Refuse duplicate keys and documents whose aliases expand past MAX_VALUES (counted on the node graph,
    each shared node once, so the bomb costs nothing to measure); a cycle through an alias is refused too."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise InventoryError(f"an alias refers to the value that contains it{_where(node.start_mark)}",
                                 file=file)
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            _no_duplicate_keys(node, file)
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_VALUES:
                raise InventoryError(f"the document expands to more than {MAX_VALUES} values (YAML aliases?)"
                                     f"{_where(node.start_mark)}", file=file)
        open_nodes.discard(key)
        sizes[key] = total
        return total

    try:
        size(root)
    except RecursionError:
        raise InventoryError("YAML nested too deeply", file=file) from None


def _no_duplicate_keys(node: yaml.MappingNode, file: str) -> None:
    seen: dict[tuple[str, str], int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line = key.start_mark.line + 1
        first = seen.get((key.tag, key.value))
        seen[(key.tag, key.value)] = line
        if first is not None:
            raise InventoryError(f"key {key.value[:_QUOTE]!r} given twice (lines {first} and {line}); "
                                 "remove one", file=file)
