"""A real user's model and flags and an API key: engine_args, checkpoint formats, secrets (issue 13)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from sparkdeploy import cli, paths, plan
from sparkdeploy.errors import InventoryError, PlanError
from sparkdeploy.model import checkpoint, inventory
from sparkdeploy.plan import render

ROOT = paths.repo_root()
PROFILES = sorted((ROOT / "deploy" / "profiles").glob("*.yaml"))


def _inventory(tmp_path: Path, profile: dict | str = "qwen3.8-flash-next-nvfp4", **top) -> Path:
    """The shipped inventory with `profile` (a name, or a mapping written next to it) and top-level changes."""
    data = yaml.safe_load(paths.default_inventory().read_text())
    data["vocab"] = str(ROOT / data["vocab"])
    if isinstance(profile, dict):
        (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
        profile = "p.yaml"
    data["profile"] = profile
    data.update(top)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _profile(**changes) -> dict:
    data = yaml.safe_load((ROOT / "deploy/profiles/qwen3.8-flash-next-nvfp4.yaml").read_text())
    data.update(changes)
    return data


class _Done:
    def __init__(self, rc: int, out: str, err: str):
        self.returncode, self.stdout, self.stderr = rc, out, err


@pytest.fixture
def run_cli(capsys):
    """The CLI in this process (its real argv parsing, error mapping and output), captured."""
    def run(*args: str) -> _Done:
        capsys.readouterr()
        rc = cli.main(list(args))
        out = capsys.readouterr()
        return _Done(rc, out.out, out.err)
    return run


# ----------------------------------------------------------------------------------------- engine_args
def test_engine_args_reach_every_rank_in_order(tmp_path):
    inv = inventory.load(_inventory(tmp_path, _profile(engine_args={
        "enable-auto-tool-choice": True, "tool_call_parser": "qwen3_coder", "--reasoning-parser": "qwen3",
        "trust-remote-code": False, "default-chat-template-kwargs": {"enable_thinking": False}})))
    p = plan.plan(inv)
    for node in p.nodes:
        tail = node.serve_argv[-8:]
        assert tail == ("--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser",
                        "qwen3", "--no-trust-remote-code", "--default-chat-template-kwargs", '{"enable_thinking":false}')
        assert "--trust-remote-code" not in node.serve_argv  # false: the pin's own negative spelling


@pytest.mark.parametrize("key, expect", [
    ("tool-call-parsr", "did you mean 'tool-call-parser'"),
    ("made-up-flag", "vLLM 0.34 has no flag --made-up-flag"),  # the shipped pin
])
def test_unknown_flag_exits_2_naming_the_profile_key(tmp_path, run_cli, key, expect):
    path = _inventory(tmp_path, _profile(engine_args={key: "x"}))
    done = run_cli("plan", "--nodes", "2", "--inventory", str(path))
    assert done.returncode == 2, done.stderr
    assert f"p.yaml: engine_args.{key}" in done.stderr and expect in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("key, owner", [
    ("tensor-parallel-size", "parallel.tp"), ("gpu-memory-utilization", "memory.gpu_memory_utilization"),
    ("port", "ports.api"), ("master-port", "ports.master"), ("speculative-config", "speculative"),
    ("served-model-name", "model.served_name"), ("api-key", "auth.api_key_file"), ("max-num-seqs", "engine.max_num_seqs"),
    ("quantization", "checkpoint.format"), ("headless", "nodes"), ("device-memory-utilization", "memory."),
])
def test_owned_flag_points_at_the_field_that_owns_it(tmp_path, key, owner):
    with pytest.raises(InventoryError) as err:
        inventory.load(_inventory(tmp_path, _profile(engine_args={key: 1})))
    assert err.value.field == f"engine_args.{key}" and owner in err.value.reason and "set by sparkdeploy" in str(err.value)


@pytest.mark.parametrize("value, expect", [
    ("bogus", "is not one of"),  # --mamba-ssm-cache-dtype has choices
    (True, "takes a value"),
    ("a\nb", "printable"),
])
def test_bad_values_are_refused(tmp_path, value, expect):
    with pytest.raises(InventoryError, match=expect):
        inventory.load(_inventory(tmp_path, _profile(engine_args={"mamba-ssm-cache-dtype": value})))


@pytest.mark.parametrize("args, key, expect", [
    # the six values vLLM 0.33's parser or config classes refuse on the node (verify report 3.3)
    ({"enable-auto-tool-choice": True, "tool-call-parser": "herms"}, "tool-call-parser", "did you mean 'hermes'"),
    ({"reasoning-parser": "qwen"}, "reasoning-parser", "registers no parser 'qwen'"),
    ({"max-logprobs": "many"}, "max-logprobs", "takes an integer"),
    ({"max-logprobs": float("nan")}, "max-logprobs", "not a value vLLM takes"),
    ({"enable-auto-tool-choice": True, "tool-call-parser": ["hermes", "openai"]}, "tool-call-parser", "not a list"),
    ({"compilation-config": {"level": 3}}, "compilation-config.level", "has no key 'level'"),
    ({"compilation-config": '{"level": 3}'}, "compilation-config.level", "has no key 'level'"),
    ({"compilation-config": {"mode": float("inf")}}, "compilation-config", "NaN and infinity"),
    ({"compilation-config": "{mode"}, "compilation-config", "takes JSON"),
    ({"gpu-memory-utilization-x": 1}, "gpu-memory-utilization-x", "no flag"),
    ({"max-log-len": 1.5}, "max-log-len", "takes an integer"),
    ({"kv-offloading-size": "lots"}, "kv-offloading-size", "takes a number"),
    ({"safetensors-prefetch-block-size": "8q"}, "safetensors-prefetch-block-size", "such as 8192 or 8k"),
    ({"tool-call-parser": {"a": 1}}, "tool-call-parser", "not a mapping"),
])
def test_values_the_pin_refuses_exit_2_at_plan_naming_the_key(tmp_path, run_cli, args, key, expect):
    path = _inventory(tmp_path, _profile(engine_args=args))
    done = run_cli("plan", "--nodes", "2", "--inventory", str(path))
    assert done.returncode == 2, done.stdout
    assert f"p.yaml: engine_args.{key}" in done.stderr and expect in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [
    {"max-logprobs": "20"}, {"max-logprobs": 20}, {"kv-offloading-size": 2}, {"kv-offloading-size": "2.5"},
    {"safetensors-prefetch-block-size": "16M"}, {"compilation-config": {"mode": 3, "cudagraph_mode": "FULL"}},
    {"reasoning-parser": "none"}, {"hf-overrides": {"rope_theta": 1e6}}, {"hf-overrides": "x"},
    {"allowed-origins": ["http://a"]},
    # a plugin may register more parsers: only the node can judge the name
    {"tool-parser-plugin": "/models/my_parser.py", "enable-auto-tool-choice": True, "tool-call-parser": "mine"},
])
def test_values_the_pin_takes_still_plan(tmp_path, args):
    p = plan.plan(inventory.load(_inventory(tmp_path, _profile(engine_args=args))))
    assert all(f"--{key}" in p.head.serve_argv for key in args)


def test_registered_parser_names_follow_the_pins_catalogue(tmp_path):
    """0.32 and 0.33 register different parsers: each plan is judged by its own pin's list."""
    from sparkdeploy.model import engine_args

    for series in ("0.32", "0.33"):
        names = engine_args.catalogue(series)["--tool-call-parser"]["registered"]
        assert "hermes" in names and "herms" not in names
        keys = engine_args.catalogue(series)["--compilation-config"]["keys"]
        assert "mode" in keys and "level" not in keys


@pytest.mark.parametrize("key, owner", [
    ("config", "the profile"), ("uds", "ports.api"), ("ssl-keyfile", "ports.api"), ("ssl-certfile", "ports.api"),
    ("data-parallel-start-rank", "parallel.dp"), ("data-parallel-hybrid-lb", "parallel.dp"),
])
def test_options_that_move_the_api_or_the_ranks_are_owned(tmp_path, run_cli, key, owner):
    path = _inventory(tmp_path, _profile(engine_args={key: True if key.endswith("-lb") else "/tmp/x"}))
    done = run_cli("plan", "--nodes", "2", "--inventory", str(path))
    assert done.returncode == 2 and f"engine_args.{key}" in done.stderr, done.stderr
    assert f"set by sparkdeploy; use {owner}" in done.stderr


@pytest.mark.parametrize("series, key, rendered", [
    ("0.33.0", "enable-chunked-prefill", "--disable-chunked-prefill"),  # 0.33 spells the negative --disable-X
    ("0.32.0", "enable-chunked-prefill", "--no-enable-chunked-prefill"),
    ("0.33.0", "disable-chunked-prefill", "--enable-chunked-prefill"),
])
def test_switch_false_renders_the_pins_opposite_spelling(tmp_path, series, key, rendered):
    image = {**yaml.safe_load(paths.default_inventory().read_text())["image"], "vllm_version": series}
    p = plan.plan(inventory.load(_inventory(tmp_path, _profile(engine_args={key: False}), image=image)))
    assert p.head.serve_argv[-1] == rendered


@pytest.mark.parametrize("args, expect", [
    ({"enable-auto-tool-choice": True, "enable_auto_tool_choice": True},
     "--enable-auto-tool-choice is given twice ('enable-auto-tool-choice' and 'enable_auto_tool_choice')"),
    ({"enable-chunked-prefill": True, "disable-chunked-prefill": True},
     "--disable-chunked-prefill sets the same option as --enable-chunked-prefill"),
])
def test_one_option_set_twice_says_how(tmp_path, args, expect):
    with pytest.raises(InventoryError) as err:
        inventory.load(_inventory(tmp_path, _profile(engine_args=args)))
    assert expect in str(err.value)


def test_switch_false_without_an_opposite_is_refused(tmp_path):
    with pytest.raises(InventoryError, match="no spelling that turns --aggregate-engine-logging off") as err:
        inventory.load(_inventory(tmp_path, _profile(engine_args={"aggregate-engine-logging": False})))
    assert err.value.field == "engine_args.aggregate-engine-logging"


def test_switch_with_a_value_is_refused(tmp_path):
    with pytest.raises(InventoryError, match="is a switch"):
        inventory.load(_inventory(tmp_path, _profile(engine_args={"enable-auto-tool-choice": "yes"})))


def test_prefix_caching_off_uses_the_pins_own_spelling(tmp_path):
    # vLLM 0.33 renamed --no-enable-prefix-caching to --disable-prefix-caching; 0.32 has only the former.
    prof = _profile(engine={**_profile()["engine"], "prefix_caching": False})
    p33 = plan.plan(inventory.load(_inventory(tmp_path, prof)))
    assert "--disable-prefix-caching" in p33.head.serve_argv and "--no-enable-prefix-caching" not in p33.head.serve_argv
    p32 = plan.plan(inventory.load(_inventory(tmp_path, prof, image={**yaml.safe_load(
        paths.default_inventory().read_text())["image"], "vllm_version": "0.32.0"})))
    assert "--no-enable-prefix-caching" in p32.head.serve_argv


def test_every_shipped_profile_plans_for_its_node_count(tmp_path):
    assert len(PROFILES) >= 6  # four real models + the sim profiles
    for prof in PROFILES:
        data = yaml.safe_load(prof.read_text())
        world = data["parallel"].get("tp", 1) * data["parallel"].get("pp", 1) * data["parallel"].get("dp", 1)
        base = yaml.safe_load(paths.default_inventory().read_text())
        base["vocab"] = str(ROOT / base["vocab"])
        base["profile"] = prof.stem
        if prof.stem.startswith("sim-"):  # the tiny models' 4k tokenizer
            base["vocab"] = str(ROOT / "tests/unit/fixtures/vocab-1k.txt")
        base["nodes"] = base["nodes"][:world]
        if not data.get("container", {}).get("gpus", True):
            for n in base["nodes"]:
                n["gpu"] = "none"
            base["image"] = {"repository": "sparkdeploy/serving-sim"}
            base["memory"] = {"reserve_gib": 4}
        if data.get("speculative", {}).get("method") != "mtp":
            base["patches"]["shortlist"] = False
        path = tmp_path / f"{prof.stem}.yaml"
        path.write_text(yaml.safe_dump(base))
        p = plan.plan(inventory.load(path), nodes=world)
        assert p.nnodes == world, prof.stem
        assert p.checkpoint is not None, f"{prof.stem}: declare checkpoint.format"


# --------------------------------------------------------------------------------------------- formats
FIXTURE_CONFIGS = {
    "modelopt_fp4": ({"model_type": "qwen4_exp"}, {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}),
    "modelopt_fp8": ({"model_type": "llama", "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}, None),
    "compressed-tensors": ({"model_type": "qwen3_next", "quantization_config": {"quant_method": "compressed-tensors",
                                                                              "format": "int-quantized"}}, None),
    "fp8": ({"model_type": "qwen3_5_moe", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, None),
    "mxfp4": ({"model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}}, None),
    "bf16": ({"model_type": "qwen3_next", "torch_dtype": "bfloat16", "layer_types": ["linear_attention", "full_attention"]}, None),
}


@pytest.mark.parametrize("fmt", sorted(FIXTURE_CONFIGS))
def test_format_decides_the_quantization_flags(tmp_path, fmt):
    config, hf_quant = FIXTURE_CONFIGS[fmt]
    ckpt = checkpoint.detect(config, hf_quant, source="head:/models/x")
    assert ckpt.format == fmt
    inv = inventory.load(_inventory(tmp_path, _profile(checkpoint=None)))
    p = plan.plan(inv, checkpoint=ckpt)
    fp8 = next(f for f in p.features if f.name == "fp8_gdn")
    argv = p.head.serve_argv
    if fmt == "bf16":
        assert fp8.enabled and argv[argv.index("--quantization") + 1] == "online"
        assert "fp8_per_channel" in argv[argv.index("--quantization-config") + 1]
    else:
        assert not fp8.enabled and "--quantization" not in argv and f"pre-quantized ({fmt})" in fp8.reason
        assert f"patch fp8_gdn off: checkpoint is pre-quantized ({fmt})" in "\n".join(p.notes)


def test_bf16_without_gdn_layers_gets_no_fp8_targets(tmp_path):
    ckpt = checkpoint.detect({"model_type": "llama"})
    p = plan.plan(inventory.load(_inventory(tmp_path, _profile(checkpoint=None))), checkpoint=ckpt)
    assert "--quantization" not in p.head.serve_argv
    assert "no GDN" in next(f for f in p.features if f.name == "fp8_gdn").reason


def test_unknown_format_says_why_fp8_gdn_is_off(tmp_path):
    p = plan.plan(inventory.load(_inventory(tmp_path, _profile(checkpoint=None))))
    assert p.checkpoint is None and "--quantization" not in p.head.serve_argv
    assert "declare checkpoint.format" in next(f for f in p.features if f.name == "fp8_gdn").reason


def test_declared_format_contradicted_by_the_head_is_an_error(tmp_path):
    inv = inventory.load(_inventory(tmp_path))  # declares modelopt_fp4
    with pytest.raises(PlanError, match="checkpoint.format: the profile says modelopt_fp4"):
        plan.plan(inv, checkpoint=checkpoint.Checkpoint("bf16", "head:/m"))


def test_unknown_declared_format_exits_2(tmp_path):
    with pytest.raises(InventoryError, match="is not one of") as err:
        inventory.load(_inventory(tmp_path, _profile(checkpoint={"format": "nvfp5"})))
    assert err.value.field == "checkpoint.format"


# ---------------------------------------------------------------------------------------------- secrets
SECRET = "sk-test-" + "7f3a" * 8


def _key_file(tmp_path: Path, mode: int = 0o600, text: str = SECRET + "\n") -> Path:
    path = tmp_path / "api.key"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_api_key_goes_to_its_env_file_and_nowhere_else(tmp_path, run_cli):
    inv_path = _inventory(tmp_path, auth={"api_key_file": str(_key_file(tmp_path))})
    p = plan.plan(inventory.load(inv_path))
    files = render.render(p)
    assert not any(SECRET.encode() in data for data in files.values())
    assert SECRET not in json.dumps(p.to_dict())
    for node in p.nodes:
        assert node.docker_argv[node.docker_argv.index("/etc/sparkdeploy/current/engine.env") + 1:][:2] == \
            ("--env-file", "/etc/sparkdeploy/secrets.env")
        assert SECRET not in " ".join(node.docker_argv)
    assert p.secrets == {"VLLM_API_KEY": "sha256:" + __import__("hashlib").sha256(SECRET.encode()).hexdigest()[:12]}
    for args in (["plan", "--nodes", "2"], ["plan", "--json"], ["render", "--out", str(tmp_path / "out")]):
        done = run_cli(*args, "--inventory", str(inv_path))
        assert done.returncode == 0, done.stderr
        assert SECRET not in done.stdout + done.stderr
    assert not any(SECRET.encode() in f.read_bytes() for f in (tmp_path / "out").rglob("*") if f.is_file())


def test_a_new_key_is_a_new_release(tmp_path):
    one = plan.plan(inventory.load(_inventory(tmp_path, auth={"api_key_file": str(_key_file(tmp_path))})))
    two = plan.plan(inventory.load(_inventory(tmp_path, auth={
        "api_key_file": str(_key_file(tmp_path, text="another-key\n"))})))
    none = plan.plan(inventory.load(_inventory(tmp_path)))
    assert len({one.release_id, two.release_id, none.release_id}) == 3
    # The key is current state: every release names the secrets env file (empty without a key), so a release
    # kept from before a key change still starts, and serves with today's key (steps/secrets.py).
    for p in (one, two, none):
        argv = p.head.docker_argv
        assert argv[argv.index("/etc/sparkdeploy/current/engine.env") + 1:][:2] == \
            ("--env-file", "/etc/sparkdeploy/secrets.env")


def test_a_rollback_is_judged_by_the_plan_its_release_recorded(tmp_path):
    """A release records where it answers, under which name, with which memory budgets (Plan.served_as); the
    plan of a later inventory, applied to that record, judges the old release by the record, not by today."""
    import dataclasses

    old = plan.plan(inventory.load(_inventory(tmp_path)))
    record = json.loads(json.dumps(old.served_as()))  # as release.json holds it
    raw = yaml.safe_load(paths.default_inventory().read_text())
    today = plan.plan(inventory.load(_inventory(tmp_path, ports=dict(raw["ports"], api=8123),
                                                memory=dict(raw.get("memory") or {}, reserve_gib=11.0))))
    assert today.api_url != old.api_url and today.head.memory != old.head.memory
    judged = today.as_served(record)
    assert judged.api_url == old.api_url
    assert [n.memory for n in judged.nodes] == [n.memory for n in old.nodes]
    assert [n.serve_argv for n in judged.nodes] == [n.serve_argv for n in old.nodes]
    assert judged.model_host_dir == old.model_host_dir
    # a release from a kit that recorded nothing, or one recorded on other nodes: today's plan, as before
    assert today.as_served(None) is today
    assert today.as_served(dict(record, nodes={"elsewhere": record["nodes"]["spark1"]})) is today
    assert dataclasses.replace(judged, api_port=today.api_port).api_url == today.api_url


@pytest.mark.parametrize("mode, text, expect", [
    (0o644, SECRET, "readable by others (mode 0644); run: chmod 600"),
    (0o600, "two words", "exactly one line"),
    (0o600, "", "exactly one line"),
    (0o600, "a\nb\n", "exactly one line"),
])
def test_bad_secret_files_exit_2_naming_the_field(tmp_path, run_cli, mode, text, expect):
    path = _inventory(tmp_path, auth={"api_key_file": str(_key_file(tmp_path, mode, text))})
    done = run_cli("plan", "--inventory", str(path))
    assert done.returncode == 2 and "auth.api_key_file" in done.stderr and expect in done.stderr, done.stderr
    assert SECRET not in done.stderr


def test_missing_secret_file_and_tilde_paths(tmp_path, run_cli, monkeypatch):
    done = run_cli("plan", "--inventory", str(_inventory(tmp_path, auth={"hf_token_file": "~/nope/hf.token"})))
    assert done.returncode == 2 and "auth.hf_token_file" in done.stderr and "nope/hf.token" in done.stderr
    monkeypatch.setenv("HOME", str(tmp_path))
    _key_file(tmp_path)
    inv = inventory.load(_inventory(tmp_path, auth={"api_key_file": "~/api.key"}))
    assert inv.auth.api_key() == SECRET and inv.auth.api_key_file == tmp_path / "api.key"
    assert SECRET not in repr(inv)


def test_doctor_warns_without_a_key_and_is_quiet_with_one(tmp_path):
    from sparkdeploy.checks import preflight
    from sparkdeploy.verdict import Status

    bare = preflight.check_api_key(inventory.load(_inventory(tmp_path)))
    assert bare.status is Status.WARN and "without a key" in bare.reason and "auth.api_key_file" in bare.fix
    keyed = preflight.check_api_key(inventory.load(_inventory(tmp_path, auth={"api_key_file": str(_key_file(tmp_path))})))
    assert keyed.status is Status.OK and SECRET not in keyed.reason


def test_a_catalogue_without_value_types_still_plans_by_name(tmp_path, monkeypatch):
    """A series whose catalogue predates types (regenerate it with scripts/vllm_flags.py) keeps today's checks."""
    from sparkdeploy.model import engine_args

    bare = {flag: {k: spec[k] for k in ("dest", "takes_value", "many", "choices")}
            for flag, spec in engine_args.catalogue("0.33").items()}
    monkeypatch.setattr(engine_args, "catalogue", lambda series: bare)
    argv = engine_args.to_argv({"compilation-config": {"mode": 3}, "tool-call-parser": "mine"}, "0.33", file="p")
    assert argv == ("--compilation-config", '{"mode":3}', "--tool-call-parser", "mine")
