"""The one YAML loader (sparkdeploy.yamlfile): bounded size, bounded alias expansion, no duplicate keys."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from sparkdeploy import yamlfile
from sparkdeploy.errors import InventoryError


def write(tmp_path, text: str, name: str = "inv.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def bomb(levels: int = 16, fan: int = 16) -> str:
    lines = ['a: &a ["' + "lol" * 30 + '"]']
    prev = "a"
    for i in range(levels):
        name = f"l{i}"
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * fan) + "]")
        prev = name
    return "\n".join(lines) + "\n"


def test_a_plain_document_loads(tmp_path):
    assert yamlfile.load(write(tmp_path, "a: 1\nb: [x, y]\nc: {d: e}\n"), "inventory") == \
        {"a": 1, "b": ["x", "y"], "c": {"d": "e"}}


def test_small_aliases_and_merge_keys_still_work(tmp_path):
    text = "base: &b {port: 22, user: root}\nnode: {<<: *b, port: 2222}\nlist: [*b, *b]\n"
    data = yamlfile.load(write(tmp_path, text), "inventory")
    assert data["node"] == {"port": 2222, "user": "root"} and data["list"] == [data["base"]] * 2


@pytest.mark.parametrize("text,line2", [("name: a\nports: {api: 1}\nports: {api: 2}\n", 3),
                                        ("nodes:\n  - name: a\n    role: head\n    role: worker\n", 4),
                                        ("{x: 1, x: 2}\n", 1)])
def test_a_key_given_twice_is_refused_naming_key_and_lines(tmp_path, text, line2):
    with pytest.raises(InventoryError, match=rf"given twice \(lines \d+ and {line2}\)"):
        yamlfile.load(write(tmp_path, text), "inventory")


def test_an_alias_bomb_is_refused_before_anything_is_built(tmp_path):
    text = bomb()
    assert len(text) < 3000
    tracemalloc.start()
    try:
        with pytest.raises(InventoryError, match="expands to more than") as err:
            yamlfile.load(write(tmp_path, text), "inventory")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, peak
    assert len(str(err.value)) < 300


def test_a_recursive_alias_is_refused(tmp_path):
    with pytest.raises(InventoryError, match="contains it|expands|syntax"):
        yamlfile.load(write(tmp_path, "a: &a [*a]\n"), "inventory")


def test_dev_zero_and_big_files_are_refused_without_reading_them(tmp_path):
    with pytest.raises(InventoryError, match="not a regular file"):
        yamlfile.load("/dev/zero", "inventory")
    with pytest.raises(InventoryError, match="larger than"):
        yamlfile.load(write(tmp_path, "a: " + "x" * (yamlfile.MAX_BYTES + 10) + "\n"), "profile")


@pytest.mark.parametrize("data,match", [(b"", "empty"), (b"\xff\xfe a: 1", "not UTF-8"), (b"a: [1, 2\n", "syntax"),
                                        (b"[" * 5000, "syntax|deep"), (b"a: !!python/object:os.system x\n", "")])
def test_bad_files_are_one_line_errors(tmp_path, data, match):
    p = tmp_path / "x.yaml"
    p.write_bytes(data)
    with pytest.raises(InventoryError, match=match) as err:
        yamlfile.load(p, "inventory")
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InventoryError, match="not found"):
        yamlfile.load(tmp_path / "nope.yaml", "inventory")
    with pytest.raises(InventoryError, match="not a regular file"):
        yamlfile.load(tmp_path, "inventory")
    with pytest.raises(InventoryError, match="cannot read inventory: File name too long"):
        yamlfile.load(tmp_path / ("n" * 5000), "inventory")


@pytest.mark.timeout(10)  # a plain open() waits for a writer forever
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "inventory.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InventoryError, match="not a regular file"):
        yamlfile.load(fifo, "inventory")
