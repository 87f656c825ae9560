"""Fixtures shared by every test tree (tests/ and overlays/tests/)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
TINY_MODEL_SCRIPT = REPO / "images" / "sim-engine" / "make_tiny_models.py"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Directory holding tiny-qwen3 and tiny-qwen3-next-mtp, made once per session (deterministic, offline).

    `$SPARKDEPLOY_TINY_MODELS` (default /opt/sparkdeploy/tiny-models, made by scripts/setup.sh) skips the build.
    """
    from tests.support.vllm_server import require_venv

    cached = os.environ.get("SPARKDEPLOY_TINY_MODELS", "/opt/sparkdeploy/tiny-models")
    if cached and all((Path(cached) / m / "config.json").is_file() for m in ("tiny-qwen3", "tiny-qwen3-next-mtp")):
        return Path(cached)
    python = require_venv()
    out = tmp_path_factory.mktemp("tiny-models")
    subprocess.run([str(python), str(TINY_MODEL_SCRIPT), "--out", str(out)], check=True, capture_output=True,
                   timeout=900)
    return out
