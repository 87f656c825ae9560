"""bench/capture_overhead.py runs its no-vLLM part end to end (the engine part is run by hand: it prints a ratio)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_step_cost_part_runs_and_reports_every_batch():
    out = subprocess.run([sys.executable, str(REPO / "bench/capture_overhead.py"), "--skip-engine", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["step"]
    assert [r["batch"] for r in rows] == [1, 4, 16, 64] and all(isinstance(r["added_us"], float) for r in rows)
    assert "engine" not in json.loads(out.stdout)
