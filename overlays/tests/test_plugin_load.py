import subprocess
import sys


def run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def test_package_import_is_light():
    out = run("import sys, spark_overlays; print('torch' in sys.modules, 'vllm' in sys.modules)").stdout
    assert out.split() == ["False", "False"]


def test_register_never_raises_and_is_idempotent():
    # in an interpreter without vLLM it fails closed, logs why, and returns; repeated calls are harmless
    code = ("import logging, spark_overlays; logging.basicConfig(level=logging.INFO)\n"
            "import importlib.util as u\n"
            "spark_overlays.register(); spark_overlays.register(); print('ok', u.find_spec('vllm') is not None)")
    out = run(code)
    assert out.stdout.startswith("ok")
    if out.stdout.split()[1] == "False":
        assert "DISABLED" in out.stderr
    else:
        assert "already loaded" in out.stderr


def test_entry_point_declared():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert data["project"]["entry-points"]["vllm.general_plugins"] == {"spark_overlays": "spark_overlays:register"}
