"""Property: any string in any field of the inventory or profile (env keys and values, hca items, image fields
included), any value of any `engine_args` flag, and any vocab file, either renders files that are each valid for
their context, or exits 2 naming the field. Never a traceback (main() lets any non-kit exception through, which
fails the example). A value that plans is one the pin's parser takes; a secret-like env name never plans."""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_overlays import vocab_list
from sparkdeploy import paths
from sparkdeploy.cli import main
from sparkdeploy.model import engine_args
from sparkdeploy.model.schema import SECRET_ENV_RE

FIXTURES = Path(__file__).parent / "fixtures"
TINY_VOCAB = 4032  # deploy/tokenizers.yaml: sparkdeploy/tiny-qwen3

# (document, dotted path, what the refusal must name). "env.*" / "hca.*": a generated key / list item.
FIELDS = [
    ("inv", "cluster", "cluster"), ("inv", "nodes.0.name", "nodes["), ("inv", "nodes.1.name", "nodes["),
    ("inv", "nodes.0.ssh.user", "nodes[0].ssh.user"), ("inv", "nodes.0.ssh.key", "nodes[0].ssh.key"),
    ("inv", "nodes.0.data_ip", "nodes[0].data_ip"), ("inv", "nodes.1.netdev", "nodes[1].netdev"),
    ("inv", "hca.*", "nodes[0].hca"), ("inv", "nodes.0.gpu", "nodes[0].gpu"), ("inv", "image.repository", "image.repository"),
    ("inv", "profile", "profile"), ("inv", "vocab", "vocab"),
    ("prof", "description", "description"), ("prof", "model.id", "model.id"), ("prof", "model.path", "model.path"),
    ("prof", "model.host_dir", "model.host_dir"), ("prof", "model.served_name", "model.served_name"),
    ("prof", "speculative.method", "speculative.method"), ("prof", "speculative.prompt_lookup_max", "speculative"),
    ("prof", "engine.kv_cache_dtype", "engine.kv_cache_dtype"), ("prof", "container.shm_size", "container.shm_size"),
    ("prof", "env.*", "env"), ("prof", "env.VLLM_PROPERTY", "env.VLLM_PROPERTY"), ("prof", "image.base", "image.base"),
    ("prof", "image.vllm_version", "image.vllm_version"), ("prof", "image.python", "image.python"),
    ("prof", "image.pip", "image.pip"),
]

NASTY = ["", " ", "\n", "a\nb", "x\n", "$(id)", "`id`", "'", '"', "\\", "%n", "{{ x }}", "${HOME}", ";reboot", "-rf",
         "--help", "../..", "/", "/opt/sparkdeploy/vocab", "0.0.0.0", "127.0.0.1", "x" * 300, "²", "ü", "\u202e",
         "\x00", "a b", "A=B", "[x]", "#c", "plan.json", "0.33.0+cpu", "repo:tag@sha256:" + "a" * 64, "\t", "\r",
         "\x85", "a\u2028b"]


def values(valid: str):
    """The field's valid value with a trailing newline (what `$`-anchored patterns let through), the valid
    value with something hostile before or after it, or any text at all."""
    return st.one_of(st.just(valid + "\n"),
                     st.sampled_from(NASTY).flatmap(lambda bad: st.sampled_from([valid + bad, bad + valid, bad])),
                     st.text(st.characters(blacklist_categories=("Cs",)), max_size=30))

ENV_LINE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[^\n]*")
UNIT_LINE = re.compile(r"\[[A-Za-z]+\]|[A-Za-z][A-Za-z0-9]*=.*")
DOCKER_WORDS = {"FROM", "RUN", "COPY", "ADD", "ENV", "LABEL", "ARG", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "SHELL",
                "EXPOSE", "HEALTHCHECK", "STOPSIGNAL", "VOLUME", "ONBUILD"}


def _documents() -> tuple[dict, dict]:
    inv = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    inv["vocab"] = str(FIXTURES / "vocab-1k.txt")
    prof = yaml.safe_load((paths.profiles_dir() / "sim-tiny.yaml").read_text())
    return inv, prof


def _set(doc: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        doc = doc[int(key)] if key.isdigit() else doc.setdefault(key, {})
    doc[int(last) if last.isdigit() else last] = value


def _apply(inv: dict, prof: dict, where: str, dotted: str, value: str) -> None:
    if dotted == "env.*":
        prof.setdefault("env", {})[value] = "1"
    elif dotted == "hca.*":
        inv["nodes"][0]["hca"] = [value]
    else:
        _set(inv if where == "inv" else prof, dotted, value)


def _check_rendered(out: Path) -> None:
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        text = path.read_text()
        lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if path.suffix == ".sh":
            done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
            assert done.returncode == 0, (path, done.stderr)
        elif path.name.endswith(".env"):
            assert all(ENV_LINE.fullmatch(line) for line in lines), (path, text)
            keys = [line.split("=", 1)[0] for line in lines]
            assert len(keys) == len(set(keys)), (path, text)
        elif path.suffix == ".service":
            assert all(UNIT_LINE.fullmatch(line) for line in lines), (path, text)
            if shutil.which("systemd-analyze"):
                done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
                bad = [m for m in done.stderr.splitlines()
                       if re.search(r"Missing '='|Invalid section|Unknown section|Failed to parse|bad unit file", m)]
                assert not bad, (path, bad)
        elif path.name == "Dockerfile":
            logical = re.sub(r"\\\n", " ", text)
            for line in logical.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    assert line.split()[0] in DOCKER_WORDS, (path, line)
                    shlex.split(line, comments=False)  # quotes balance
        elif path.suffix == ".json":
            json.loads(text, parse_constant=_no_constant)  # RFC 8259: no NaN or Infinity


def _no_constant(name: str):
    raise AssertionError(f"{name} in JSON output")


def _valid(where: str, dotted: str) -> str:
    if dotted == "env.*":
        return "VLLM_PROPERTY"
    if dotted == "hca.*":
        return "mlx5_0"
    doc = _documents()[0 if where == "inv" else 1]
    for key in dotted.split("."):
        doc = doc[int(key)] if key.isdigit() else (doc or {}).get(key)
    return str(doc) if doc is not None else "x"


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f[1])
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_any_string_in_any_field_renders_valid_files_or_exits_2_naming_it(tmp_path_factory, capsys, field, data):
    where, dotted, named = field
    value = data.draw(values(_valid(where, dotted)), label="value")
    tmp = tmp_path_factory.mktemp("prop")
    inv, prof = _documents()
    _apply(inv, prof, where, dotted, value)
    (tmp / "prof.yaml").write_text(yaml.safe_dump(prof, allow_unicode=True))
    if not (where == "inv" and dotted == "profile"):
        inv["profile"] = "prof.yaml"
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(inv, allow_unicode=True))
    capsys.readouterr()
    rc = main(["render", "--inventory", str(tmp / "inventory.yaml"), "--out", str(tmp / "out")])
    err = capsys.readouterr().err
    assert rc in (0, 2), (rc, err)
    if rc == 0:
        _check_rendered(tmp / "out")
    else:
        assert named in err and "Traceback" not in err, (field, value, err)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(st.integers(-5, TINY_VOCAB + 5).map(str), st.sampled_from(NASTY),
                                st.text("0123456789 #+-\t²٣[],", max_size=12)), max_size=12))
def test_any_vocab_file_loads_sorted_in_range_or_exits_2_naming_file_and_line(tmp_path_factory, capsys, lines):
    tmp = tmp_path_factory.mktemp("vocab")
    listing = tmp / "list.txt"
    listing.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
    inv, _ = _documents()
    inv["vocab"] = str(listing)
    inv["profile"] = str(paths.profiles_dir() / "sim-tiny.yaml")
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(inv))
    capsys.readouterr()
    rc = main(["plan", "--inventory", str(tmp / "inventory.yaml"), "--json"])
    err = capsys.readouterr().err
    assert rc in (0, 2), (rc, err)
    if rc == 0:
        ids = vocab_list.read_ids(listing, TINY_VOCAB)  # what the engine reads: the same ids
        assert ids.size and np.all(np.diff(ids) > 0) and ids[0] >= 0 and ids[-1] < TINY_VOCAB
    else:
        assert "vocab" in err and str(listing) in err and "Traceback" not in err, err
        with pytest.raises(vocab_list.VocabListError):  # and the engine refuses it as well
            ids = vocab_list.read_ids(listing, TINY_VOCAB)
            vocab_list.validate(ids, TINY_VOCAB)


SIM_SERIES = "0.32"  # sim-tiny's pin
SIM_FLAGS = sorted(engine_args.catalogue(SIM_SERIES))
SCALARS = st.one_of(st.text(max_size=12), st.integers(-3, 1 << 40), st.floats(), st.booleans(), st.none(),
                    st.sampled_from(["hermes", "qwen3", "herms", "8k", "1.5", "auto", "none", "{\"mode\": 3}",
                                     "{\"level\": 3}", "[1]", "nan"]))
FLAG_VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(
    st.sampled_from(["mode", "level", "backend", "x", "cudagraph_mode"]), SCALARS, max_size=2))


def _pin_takes(spec: dict, words: list[str]) -> None:
    """What vLLM's converter for the flag's type and its parser registry would make of each planned word."""
    for word in words:
        kind = spec["type"]
        if kind == "int":
            int(word)
        elif kind == "float":
            assert math.isfinite(float(word)), word
        elif kind == "json":
            json.loads(word, parse_constant=_no_constant)
        if spec["choices"]:
            assert word in spec["choices"], word
        if spec["registered"]:
            assert word in spec["registered"] or word.lower() == "none", word


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(SIM_FLAGS), value=FLAG_VALUES)
def test_any_engine_args_value_plans_as_the_pin_parses_it_or_exits_2_naming_the_key(tmp_path_factory, capsys,
                                                                                    key, value):
    tmp = tmp_path_factory.mktemp("eargs")
    inv, prof = _documents()
    prof["engine_args"] = {key[2:]: value}
    (tmp / "prof.yaml").write_text(yaml.safe_dump(prof, allow_unicode=True))
    inv["profile"] = "prof.yaml"
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(inv, allow_unicode=True))
    capsys.readouterr()
    rc = main(["plan", "--inventory", str(tmp / "inventory.yaml"), "--json"])
    out = capsys.readouterr()
    assert rc in (0, 2), (rc, out.err)
    if rc == 2:
        assert f"engine_args.{key[2:]}" in out.err and "Traceback" not in out.err, (key, value, out.err)
        return
    json.loads(out.out, parse_constant=_no_constant)
    flags = engine_args.catalogue(SIM_SERIES)
    words = list(engine_args.to_argv({key[2:]: value}, SIM_SERIES, file="p"))
    assert flags[words[0]]["dest"] == flags[key]["dest"], words  # the flag, or its opposite spelling for false
    _pin_takes(flags[key], words[1:])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
                      st.sampled_from(["VLLM_API_KEY", "HF_TOKEN", "X_TOKEN", "A_KEY", "MY_SECRET_X", "PASSWORD",
                                       "hf_token", "KEY", "TOKEN", "VLLM_KEYS", "TOKENIZERS_PARALLELISM"])),
       value=st.text(max_size=20))
def test_a_profile_env_plans_whole_or_exits_2_and_never_with_a_secret_name(tmp_path_factory, capsys, name, value):
    tmp = tmp_path_factory.mktemp("env")
    inv, prof = _documents()
    prof["env"] = {name: value}
    (tmp / "prof.yaml").write_text(yaml.safe_dump(prof, allow_unicode=True))
    inv["profile"] = "prof.yaml"
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(inv, allow_unicode=True))
    capsys.readouterr()
    rc = main(["render", "--inventory", str(tmp / "inventory.yaml"), "--out", str(tmp / "out")])
    err = capsys.readouterr().err
    assert rc in (0, 2), (rc, err)
    if SECRET_ENV_RE.fullmatch(name):
        assert rc == 2 and f"env.{name}" in err and "auth.api_key_file" in err, (name, err)
    elif rc == 2:
        assert f"env.{name}" in err and "Traceback" not in err, (name, value, err)
    else:
        _check_rendered(tmp / "out")
        assert all(re.search(f"^{name}=", p.read_text(), re.M) for p in (tmp / "out").rglob("engine.env")), name
