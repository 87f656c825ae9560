"""scripts/ci_summary.py --before: two runs' timing logs side by side, the table a CI-time change is judged by."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci_summary.py"


def _log(path: Path, tests: dict[str, tuple[str, float, float]]) -> Path:
    """{nodeid: (worker, setup s, call s)} as the spans sparkdeploy.timing writes."""
    lines = [json.dumps({"kind": f"test {part}", "what": f"{worker} {nodeid}", "seconds": sec, "ok": True})
             for nodeid, (worker, setup, call) in tests.items() for part, sec in (("setup", setup), ("call", call))]
    path.write_text("\n".join(lines + ['{"kind": "test call", "what": "gw0 cut-by-a-kil']) + "\n")
    return path


def test_before_and_after_per_worker_module_and_test_with_the_change(tmp_path):
    before = _log(tmp_path / "before.jsonl", {"tests/cluster/test_a.py::one": ("gw0", 100, 20),
                                              "tests/cluster/test_a.py::two": ("gw1", 0, 300),
                                              "tests/unit/test_b.py::gone": ("gw0", 0, 5)})
    after = _log(tmp_path / "after.jsonl", {"tests/cluster/test_a.py::one": ("gw1", 50, 20),
                                            "tests/cluster/test_a.py::two": ("gw0", 0, 120),
                                            "tests/unit/test_b.py::new": ("gw0", 0, 7)})
    (tmp_path / "after.tsv").write_text("apt (Debian packages)\t30\nmake test (setup script + pytest)\t2000\n")
    out = subprocess.run([sys.executable, str(SCRIPT), "--timing", str(after), "--phases", str(tmp_path / "after.tsv"),
                          "--before", str(before)], capture_output=True, text=True, check=True).stdout
    rows = {line.split()[-1]: line.split()[:-1] for line in out.splitlines() if line[:1] in (" ", "-") or
            line[:1].isdigit()}
    assert rows["gw0"] == ["125", "127", "+2"] and rows["gw1"] == ["300", "70", "-230"], out
    assert rows["tests/cluster/test_a.py"] == ["420", "190", "-230"], out
    assert rows["tests/cluster/test_a.py::two"] == ["300", "120", "-180"], out
    assert rows["tests/unit/test_b.py::gone"] == ["5", "-"] and rows["tests/unit/test_b.py::new"] == ["-", "7"], out
    assert "make test (setup script + pytest)" in out and rows["pytest)"][:2] == ["-", "2000"], out
