"""`sparkdeploy profile import`: recipes in the community kit's and sparkrun's formats (fixtures modelled on public
ones: solo, cluster, MTP, env-heavy) import to profiles that plan; what a profile cannot hold is listed; a flag the
pinned vLLM lacks and a secret in env are refused with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdeploy import paths
from sparkdeploy.cli import main
from sparkdeploy.errors import InventoryError
from sparkdeploy.model import inventory, recipe
from sparkdeploy.plan import plan

RECIPES = Path(__file__).parent / "fixtures" / "recipes"
SERIES = "0.34"


def _import(tmp_path: Path, name: str, *extra: str) -> Path:
    out = tmp_path / f"{Path(name).stem}.yaml"
    assert main(["profile", "import", str(RECIPES / name), "--out", str(out), *extra]) == 0
    return out


def _plan_with(tmp_path: Path, profile_file: Path):
    """Plan the shipped GB10 inventory (its two nodes, or its head alone for a TP=1 profile) with this profile."""
    data = yaml.safe_load(paths.default_inventory().read_text())
    data["vocab"] = str(paths.repo_root() / data["vocab"])
    data["profile"] = str(profile_file)
    tp = yaml.safe_load(profile_file.read_text())["parallel"]["tp"]
    data["nodes"] = data["nodes"][:tp]
    inv_file = tmp_path / "inventory.yaml"
    inv_file.write_text(yaml.safe_dump(data, sort_keys=False))
    return plan(inventory.load(inv_file))


@pytest.mark.parametrize("name, tp, argv_has", [
    ("kit-solo-nemotron-nano.yaml", 1, ["--reasoning-parser-plugin", "--load-format", "fastsafetensors"]),
    ("kit-cluster-minimax.yaml", 2, ["--tool-call-parser", "minimax_m2", "--trust-remote-code"]),
    ("kit-mtp-nemotron-super.yaml", 2, ["--mamba-ssm-cache-dtype", "float32", "--attention-backend"]),
    ("kit-mtp-gemma-escaped.yaml", 2, ["--enable-force-include-usage"]),
    ("sparkrun-env-heavy-qwen3.8.yaml", 2, ["--moe-backend", "b12x", "--dtype", "bfloat16"]),
    ("sparkrun-structured-qwen3.yaml", 1, ["--reasoning-parser", "deepseek_r1", "--disable-chunked-prefill"]),
])
def test_each_recipe_imports_to_a_profile_that_plans(tmp_path, name, tp, argv_has):
    p = _plan_with(tmp_path, _import(tmp_path, name, "--weights-gib", "20"))
    assert p.tp == tp and len(p.nodes) == tp
    for word in argv_has:
        assert word in p.head.serve_argv
    assert "--host" in p.head.serve_argv and p.head.serve_argv.count("--port") == 1  # the kit's, not the recipe's


def test_the_kits_flags_land_in_their_fields_and_inventory_settings_are_listed():
    imp = recipe.import_recipe(RECIPES / "kit-mtp-nemotron-super.yaml", series=SERIES)
    prof = imp.profile
    assert prof["parallel"]["tp"] == 2 and prof["engine"]["max_model_len"] == 262144
    assert prof["engine"] == {"kv_cache_dtype": "fp8", "max_model_len": 262144, "max_num_seqs": 10,
                              "prefix_caching": True, "activation_gib": 4.0}
    assert prof["speculative"] == {"method": "nemotron_h_mtp", "num_speculative_tokens": 5}
    assert prof["env"]["VLLM_USE_FLASHINFER_MOE_FP4"] == "0" and prof["env"]["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    owned = ("gpu-memory-utilization", "port", "host", "tensor-parallel-size", "speculative-config",
             "distributed-executor-backend", "max-model-len")
    assert not set(prof["engine_args"]) & set(owned)
    assert any(line.startswith("backend: ray") for line in imp.inventory)
    assert any(line.startswith("ports.api: 8000") for line in imp.inventory)


def test_escaped_braces_and_sparkrun_placeholders_inside_json_both_fill():
    gemma = recipe.import_recipe(RECIPES / "kit-mtp-gemma-escaped.yaml", series=SERIES).profile
    assert gemma["speculative"] == {"method": "mtp", "model": "google/gemma-4-26B-A4B-it-assistant",
                                    "num_speculative_tokens": 4, "moe_backend": "triton"}
    qwen = recipe.import_recipe(RECIPES / "sparkrun-env-heavy-qwen3.8.yaml", series=SERIES).profile
    assert qwen["speculative"] == {"method": "mtp", "num_speculative_tokens": 3}
    assert qwen["model"]["id"] == "RadixArk/Qwen3.8-Flash-Next-NVFP4" and len(qwen["env"]) == 14


def test_what_a_profile_cannot_hold_is_listed_in_the_file_and_on_stderr(tmp_path, capsys):
    out = _import(tmp_path, "sparkrun-env-heavy-qwen3.8.yaml")
    header = out.read_text().split("\ndescription:")[0]
    for text in ("taskset -c 5-9,15-19", "mod @eugr/mods/fix-qwen3.8-flash-next-vllm",
                 "container 'ghcr.io/spark-arena/dgx-vllm-eugr-nightly-b12x:latest': not pinned by digest",
                 "model.weights_gib", "--quantization modelopt", "min_nodes: 2", "checkpoint.format: the recipe"):
        assert text in header
    err = capsys.readouterr().err
    assert "not carried over: mod @eugr/mods/drop-caches" in err
    nano = recipe.import_recipe(RECIPES / "kit-solo-nemotron-nano.yaml", series=SERIES)
    assert "mod mods/fix-nemotron-nano: the community kit (eugr/spark-vllm-docker)'s own; its effect is not in the " \
           "profile" in nano.unmapped
    assert any(line.startswith("defaults.tensor_parallel: 1") for line in nano.unmapped)
    assert any(line.startswith("solo_only: true") for line in nano.notes)


def test_a_command_less_sparkrun_recipe_takes_its_flags_from_defaults():
    imp = recipe.import_recipe(RECIPES / "sparkrun-structured-qwen3.yaml", series=SERIES)
    assert imp.profile["model"]["served_name"] == "qwen3-1.7b" and imp.profile["engine"]["max_model_len"] == 32768
    assert imp.profile["engine_args"] == {"reasoning-parser": "deepseek_r1", "trust-remote-code": True,
                                          "enable-chunked-prefill": False}
    assert any(line.startswith("defaults.speculative_tokens: 2 (no vllm serve flag") for line in imp.unmapped)
    assert any(line.startswith("builder: eugr") for line in imp.unmapped)
    assert any(line.startswith("memory.gpu_memory_utilization: 0.3") for line in imp.inventory)


def test_flags_the_pinned_vllm_lacks_are_refused_naming_each(capsys):
    assert main(["profile", "import", str(RECIPES / "kit-fork-flags-glm.yaml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    for flag in ("--no-enable-flashinfer-autotune", "--prefill-compute-share", "--max-parallel-prefills",
                 "--max-num-prefill-tokens-per-step"):
        assert flag in err


@pytest.mark.parametrize("mutate, field, text", [
    (lambda r: r["env"].update(HF_TOKEN="hf_x"), "env.HF_TOKEN", "looks like a secret"),
    (lambda r: r.update(command=r["command"] + " --api-key sk-1\n"), "command --api-key", "secret in argv"),
    (lambda r: r.update(command=r["command"].replace("{max_model_len}", "{context}")), "command", "{context}"),
    (lambda r: r.update(command=r["command"].replace("qwen3_coder", "qwen9")), "command.tool-call-parser",
     "registers no parser 'qwen9'"),
    (lambda r: r.update(command="python -m sglang.launch_server"), "command", "no `vllm serve`"),
])
def test_bad_recipes_exit_2_naming_the_field(tmp_path, capsys, mutate, field, text):
    raw = yaml.safe_load((RECIPES / "kit-mtp-nemotron-super.yaml").read_text())
    mutate(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(InventoryError) as err:
        recipe.import_recipe(path, series=SERIES)
    assert err.value.field == field and text in str(err.value)
    assert main(["profile", "import", str(path), "--dry-run"]) == 2


def test_dry_run_writes_nothing_and_an_existing_profile_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "x.yaml"
    assert main(["profile", "import", str(RECIPES / "kit-cluster-minimax.yaml"), "--out", str(out),
                 "--dry-run"]) == 0
    assert not out.exists() and "id: cyankiwi/MiniMax-M2.5-AWQ-4bit" in capsys.readouterr().out
    out.write_text("keep")
    assert main(["profile", "import", str(RECIPES / "kit-cluster-minimax.yaml"), "--out", str(out)]) == 2
    assert out.read_text() == "keep"


def test_the_shipped_imported_profile_is_what_the_import_writes(tmp_path):
    shipped = paths.profiles_dir() / "nemotron-3-super-120b-nvfp4-mtp.yaml"
    out = _import(tmp_path, "kit-mtp-nemotron-super.yaml", "--weights-gib", "67", "--kv-bytes-per-token", "4096",
                  "--checkpoint-format", "modelopt_fp4")
    assert yaml.safe_load(shipped.read_text()) == yaml.safe_load(out.read_text())
    p = _plan_with(tmp_path, shipped)
    assert p.speculative_config == {"method": "nemotron_h_mtp", "num_speculative_tokens": 5}


def test_a_profile_cannot_set_speculation_behind_the_kits_back():
    """--spec-method/--spec-tokens would fight the kit's --speculative-config: a profile's engine_args refuse them."""
    from sparkdeploy.model import engine_args

    with pytest.raises(InventoryError, match="--spec-tokens is set by sparkdeploy; use speculative"):
        engine_args.to_argv({"spec-tokens": 3}, SERIES, file="p.yaml")


_WORDS = ["--port", "8000", "-tp", "2", "--tensor-parallel-size", "x", "--speculative-config", '{"method":"mtp"}',
          "{}", "--max-model-len", "4k", "--enable-prefix-caching", "--disable-prefix-caching", "--kv-cache-dtype",
          "fp8", "nvfp4", "--tool-call-parser", "hermes", "--api-key", "--no-such-flag", "--served-model-name",
          "a b", "--load-format=safetensors", "--trust-remote-code=1", "-", "--", "'", "{x}", "{{", "}}", "\\", "\n"]



def imports_or_is_refused_naming_the_file(path) -> None:
    """A recipe either imports to a profile the profile loader takes, or is refused naming its file."""
    from sparkdeploy.model.profile import load_profile

    try:
        imp = recipe.import_recipe(path, series=SERIES)
    except InventoryError as err:
        assert str(path) in str(err)
        return
    out = path.with_name("p.yaml")
    out.write_text(imp.to_yaml("recipe.yaml"))
    load_profile(out)

@settings(max_examples=150, deadline=None)
@given(words=st.lists(st.one_of(st.sampled_from(_WORDS), st.text(max_size=12)), max_size=14),
       sparkrun=st.booleans())
def test_any_command_imports_or_is_refused_naming_the_recipe(tmp_path_factory, words, sparkrun):
    """Whatever words follow `vllm serve`: a profile the profile loader takes, or an InventoryError naming the
    recipe file (never another exception)."""
    path = tmp_path_factory.mktemp("r") / "recipe.yaml"
    raw = {"recipe_version": "2" if sparkrun else "1", "model": "org/m", "container": "img",
           "defaults": {"port": 8000}, "command": "vllm serve org/m --max-model-len 4096 " + " ".join(words)}
    path.write_text(yaml.safe_dump(raw))
    imports_or_is_refused_naming_the_file(path)


_KEYS = ["port", "tensor_parallel", "max_model_len", "trust_remote_code", "enable_chunked_prefill", "api_key",
         "speculative_config", "kv_cache_dtype", "served_model_name", "tool_call_parser", "data_parallel"]


@settings(max_examples=150, deadline=None)
@given(defaults=st.dictionaries(st.one_of(st.sampled_from(_KEYS), st.text(max_size=10)),
                                st.one_of(st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=True),
                                          st.text(max_size=10), st.lists(st.integers(), max_size=2)), max_size=8))
def test_any_command_less_sparkrun_defaults_import_or_are_refused(tmp_path_factory, defaults):
    path = tmp_path_factory.mktemp("r") / "recipe.yaml"
    path.write_text(yaml.safe_dump({"recipe_version": "2", "runtime": "vllm", "model": "org/m",
                                    "defaults": {"max_model_len": 4096, **defaults}}))
    imports_or_is_refused_naming_the_file(path)
