"""`bench probe` prints joules per generated token where this machine reads the service's GPU power, and why not
otherwise. The GPU is a test double: a fake `nvidia-smi` on PATH (tests/support/fake_nvidia_smi.py) stands in for
GB10's, which we cannot run here; the engine is the fake vLLM on loopback (this machine)."""

from __future__ import annotations

import json

import pytest

from sparkdeploy.bench import power
from sparkdeploy.cli import main
from tests.support import fake_nvidia_smi
from tests.unit.bench.fake_vllm import FakeVllm


@pytest.fixture
def fake():
    with FakeVllm() as f:
        yield f


def _probe(fake, tmp_path, capsys) -> tuple[dict, str]:
    out = tmp_path / "probe.json"
    assert main(["bench", "probe", "--url", fake.url, "--tokens", "20", "--runs", "2", "--warmup", "0",
                 "--out", str(out)]) == 0
    return json.loads(out.read_text()), capsys.readouterr().err


def test_probe_prints_joules_per_token_where_power_is_readable(fake, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_nvidia_smi.install(tmp_path / "bin", "40.00, 2405, 93")))
    result, err = _probe(fake, tmp_path, capsys)
    assert result["power"] == {"source": "nvidia-smi", "measured": True, "why_not": None}
    kept = [r for r in result["runs"] if r["kept"] and not r["warmup"]]
    for run in kept:  # 40 W over the request's time, over its 20 tokens
        req = run["requests"][0]
        assert run["values"]["gpu_power_w"] == 40.0
        assert run["values"]["joules_per_token"] == pytest.approx(40.0 * req["total_s"] / req["completion_tokens"])
    median = result["metrics"]["code/joules_per_token"]["median"]
    assert result["metrics"]["code/joules_per_token"]["unit"] == "J/token"
    assert f"energy: code {median:.3g} J/token at 40.0 W" in err


@pytest.mark.parametrize("line, rc, why", [
    (None, 0, "nvidia-smi does not answer here (no NVIDIA GPU or driver)"),      # no nvidia-smi: the sim
    ("NVIDIA-SMI has failed", 9, "nvidia-smi does not answer here"),
    ("[N/A], 2405, 93", 0, "nvidia-smi reports no power.draw for this GPU"),
])
def test_probe_says_why_it_did_not_measure_energy(fake, tmp_path, capsys, monkeypatch, line, rc, why):
    bin_dir = fake_nvidia_smi.install(tmp_path / "bin", line, rc) if line else tmp_path / "empty"
    monkeypatch.setenv("PATH", str(bin_dir))  # only the double (or nothing): a real nvidia-smi stays out of sight
    result, err = _probe(fake, tmp_path, capsys)
    assert not result["power"]["measured"] and why in result["power"]["why_not"]
    assert f"energy: not measured: {why}" in err
    assert "code/joules_per_token" not in result["metrics"]


def test_a_service_on_another_machine_is_not_this_gpus_to_measure(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_nvidia_smi.install(tmp_path / "bin", "40.00, 2405, 93")))
    assert "not on this machine" in power.why_unreadable("http://192.0.2.7:8000")
    assert power.why_unreadable("http://127.0.0.1:8000") is None
    assert power.joules_per_token(None, 2.0, 20) is None and power.joules_per_token(40.0, 2.0, 0) is None
