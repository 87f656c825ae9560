"""Import a recipe from the field into a profile: the community kit's (eugr/spark-vllm-docker `recipes/*.yaml`,
`recipe_version: "1"`) and sparkrun's (`recipe_version: "2"`, `runtime: vllm`). Reads one file (and loads the
result through the profile loader from a temporary copy); returns the profile as data plus what the recipe asked
for that a profile cannot hold.

A recipe is a `vllm serve` command with `{placeholders}` filled from `defaults` (the kit formats it with
Python's str.format, so `{{` is a brace; sparkrun fills only the names it knows; a sparkrun recipe without a
command has one flag per `defaults` key, as sparkrun's runtime renders it), a model, a container, env, and
the kit's own parts (mods, build_args, cluster_only/solo_only). The command's flags are read with the pinned
vLLM's flag catalogue (engine_args.catalogue), so a flag that vLLM does not have is refused here, not on the
node. Each flag lands where sparkdeploy keeps it:
  * the model, TP/PP/DP/EP, speculative config, served name, context length, batch limits, KV dtype, eager and
    prefix caching: the profile's own fields;
  * the API port, the GPU memory fraction and the executor backend: the inventory's (listed, to set there);
  * the listen address and the multi-node rendezvous: the kit decides (listed);
  * every other flag: `engine_args`, checked as a profile's are.
Env goes to the profile's env (secret-like names refused as there). A container pinned by digest becomes
`image.base`. What cannot be carried over (mods, build args, a tag-only or locally built container, a
wrapper before `vllm serve`, defaults no placeholder uses) is listed in `Imported.unmapped`, never dropped.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sparkdeploy import yamlfile
from sparkdeploy.errors import InventoryError
from sparkdeploy.model import checkpoint, engine_args
from sparkdeploy.model.fields import CONTROL_RE
from sparkdeploy.model.profile import DIGEST_REF_RE, env_items
from sparkdeploy.model.schema import KV_DTYPES, MODEL_STORE, SERVED_RE

# vLLM's short spellings (its parser adds them beside the long flags the catalogue lists)
SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size",
               "-q": "--quantization"}
_KIT_KEYS = ("recipe_version", "name", "description", "model", "container", "build_args", "mods", "cluster_only",
             "solo_only", "defaults", "env", "command")
_SPARKRUN_KEYS = ("recipe_version", "model", "runtime", "executor", "builder", "container", "min_nodes",
                  "max_nodes", "metadata", "mods", "defaults", "env", "command")
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SLUG_RE = re.compile(r"[^a-z0-9._-]+")
# vLLM dest -> the profile's engine key (integers), parallel key, the inventory field, the speculative key
_ENGINE_FIELDS = {"max_model_len": "max_model_len", "max_num_seqs": "max_num_seqs",
                  "max_num_batched_tokens": "max_num_batched_tokens"}
_PARALLEL_FIELDS = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "data_parallel_size": "dp"}
# sparkrun's command-less recipes: its defaults keys whose flag is not the key's own name
_STRUCTURED_FLAGS = {"tensor_parallel": "-tp", "pipeline_parallel": "-pp", "data_parallel": "--data-parallel-size"}
_SPEC_FLAGS = {"spec_method": "method", "spec_tokens": "num_speculative_tokens", "spec_model": "model"}


@dataclass(frozen=True)
class Imported:
    name: str
    kind: str  # which recipe format it was read as
    profile: dict[str, Any]
    inventory: tuple[str, ...] = ()  # "ports.api: 8000 (from --port)": what to set in the inventory
    unmapped: tuple[str, ...] = ()  # what the recipe asked for that the profile does not carry
    notes: tuple[str, ...] = ()  # what the kit decides instead of the recipe

    def to_yaml(self, source: str) -> str:
        """The profile file: a header that says where it came from and lists what was not carried over."""
        lines = [f"# Imported by `sparkdeploy profile import` from {source} ({self.kind}).", "#"]
        sections = (("Set in the inventory (a profile cannot hold these):", self.inventory),
                    ("Not carried over (the recipe's own parts; apply or drop them yourself):", self.unmapped),
                    ("Decided by sparkdeploy instead:", self.notes))
        for title, items in sections:
            if items:
                lines += [f"# {title}"] + [f"#   - {_one_line(item)}" for item in items] + ["#"]
        body = yaml.safe_dump(self.profile, sort_keys=False, width=110, allow_unicode=False)
        return "\n".join(lines[:-1]) + "\n" + body


def _one_line(text: str) -> str:
    """A listed item as one printable comment line (recipe text may hold any character)."""
    return CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], text)


def import_recipe(path: str | Path, *, series: str, name: str | None = None, weights_gib: float | None = None,
                  kv_bytes_per_token: int | None = None, checkpoint_format: str | None = None) -> Imported:
    """Read the recipe at `path` for vLLM `series` ("0.34") into a profile named `name` (default: the file's stem);
    InventoryError naming the recipe file and its field for anything wrong or impossible."""
    path = Path(path)
    file = str(path)
    raw = yamlfile.load(path, "recipe")
    if not isinstance(raw, dict):
        raise InventoryError("expected a recipe: a mapping with model, container, command", file=file)
    sparkrun = str(raw.get("recipe_version", "1")) != "1" or "runtime" in raw
    kind = "sparkrun recipe" if sparkrun else "community kit recipe"
    owner = "sparkrun" if sparkrun else "the community kit (eugr/spark-vllm-docker)"
    unmapped: list[str] = []
    for key in raw:
        if key not in (_SPARKRUN_KEYS if sparkrun else _KIT_KEYS):
            unmapped.append(f"{key}: not a recipe field sparkdeploy knows")
    if sparkrun and raw.get("runtime", "vllm") != "vllm":
        raise InventoryError(f"runtime {raw['runtime']!r}: sparkdeploy serves with vLLM only", file=file,
                             field="runtime")
    command = raw.get("command")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise InventoryError("expected a mapping of placeholder names to values", file=file, field="defaults")
    model = raw.get("model")
    builder = _Builder(series, file)
    model_word = None
    if command is None and sparkrun:  # sparkrun renders a command-less recipe's flags from its defaults
        for key, value in defaults.items():
            builder.add_default(str(key), value)
        builder.notes.append("no command: the flags are the defaults' own names, as sparkrun renders them")
    else:
        if not isinstance(command, str) or not command.strip():
            raise InventoryError("missing; expected the `vllm serve ...` command", file=file, field="command")
        values = {**{str(k): v for k, v in defaults.items()}, **({"model": model} if model else {})}
        text, used = _fill(command, values, sparkrun, file)
        unmapped += [f"defaults.{k}: {v!r} (no placeholder of the command uses it)" for k, v in defaults.items()
                     if k not in used]
        prefix, model_word, flags = _split_serve(_words(text, file), file)
        if prefix:
            unmapped.append(f"command prefix `{shlex.join(prefix)}` (a wrapper, CPU pinning or env before `vllm "
                            "serve`; the kit starts vllm serve itself)")
        for flag, words in flags:
            builder.add(flag, words)
    builder.fail_on_unknown()

    model_id = builder.model or model_word or model
    if not isinstance(model_id, str) or not model_id:
        raise InventoryError("no model: give `model:` or `vllm serve MODEL`", file=file, field="model")
    if model and model_id != model:
        unmapped.append(f"the command serves {model_id!r} but `model:` is {model!r}: the profile takes the command's")
    slug = _SLUG_RE.sub("-", model_id.rsplit("/", 1)[-1].lower()).strip("-.") or "model"
    served = builder.served_name or slug
    if not SERVED_RE.fullmatch(served):
        raise InventoryError(f"{served!r} is not a served model name", file=file, field="command --served-model-name")
    if builder.max_model_len is None:
        raise InventoryError("the command sets no --max-model-len; a profile needs one (add it to the recipe)",
                             file=file, field="command")
    if weights_gib is None:
        unmapped.append("model size: a recipe does not state it; set model.weights_gib (and kv_bytes_per_token) "
                        "before trusting the plan's memory figures (import with --weights-gib)")

    profile: dict[str, Any] = {"description": _description(raw, sparkrun, model_id)}
    profile["model"] = {"id": model_id, "path": f"/models/{slug}", "host_dir": f"{MODEL_STORE}/{slug}",
                        "served_name": served, "weights_gib": float(weights_gib or 0.0),
                        "kv_bytes_per_token": int(kv_bytes_per_token or 0)}
    fmt = checkpoint_format or builder.checkpoint_format
    if fmt:
        profile["checkpoint"] = {"format": fmt}
    else:
        unmapped.append("checkpoint.format: the recipe does not say; the plan reads it from the checkpoint on the "
                        "head (import with --checkpoint-format to state it)")
    profile["parallel"] = {"tp": 1, "pp": 1, "dp": 1, "expert_parallel": False, **builder.parallel}
    if builder.speculative:
        profile["speculative"] = builder.speculative
    profile["engine"] = {**builder.engine, "activation_gib": 4.0}
    if builder.engine_args:
        engine_args.to_argv(builder.engine_args, series, file=file, field="command")  # the pin's own checks
        profile["engine_args"] = builder.engine_args
    env = raw.get("env") or {}
    items = env_items(env, "env", file)
    if items:
        profile["env"] = dict(items)
    container = raw.get("container")
    if isinstance(container, str) and DIGEST_REF_RE.fullmatch(container):
        profile["image"] = {"base": container}
    elif container:
        unmapped.append(f"container {container!r}: not pinned by digest (a tag or a locally built image); the "
                        "kit builds its serving image from the inventory's image.base, name@sha256:...")
    for key in ("builder", "executor"):
        if raw.get(key):
            unmapped.append(f"{key}: {_text(raw[key])} (how sparkrun builds or runs its container; the kit builds and "
                            "runs its own image)")
    for key in ("build_args", "mods"):
        for item in raw.get(key) or ():
            unmapped.append(f"{key[:-1].replace('_', ' ')} {item}: {owner}'s own; its effect is not in the profile")
    for key in ("cluster_only", "solo_only", "min_nodes", "max_nodes"):
        if raw.get(key) not in (None, False):
            builder.notes.append(f"{key}: {_text(raw[key])} (the inventory's nodes and parallel.tp decide where it "
                                 "runs)")
    imported = Imported(name=name or path.stem, kind=kind, profile=profile, inventory=tuple(builder.inventory),
                        unmapped=tuple(unmapped + builder.unmapped), notes=tuple(builder.notes))
    _check_loads(imported, file)
    return imported


def _check_loads(imported: Imported, file: str) -> None:
    """The profile loads as a shipped one would (its bounds: TP 1..64, MTP depth 0..8, ...); a refusal names the
    recipe and the profile field its value went to."""
    import tempfile

    from sparkdeploy.model.profile import load_profile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{imported.name}.yaml"
        out.write_text(imported.to_yaml(file))
        try:
            load_profile(out)
        except InventoryError as err:
            raise InventoryError(f"gives a profile sparkdeploy refuses: {err.field}: {err.reason}", file=file,
                                 field="command") from None


def _fill(command: str, values: dict[str, Any], sparkrun: bool, file: str) -> tuple[str, set[str]]:
    """The command with its placeholders filled, and the names it used. The community kit runs str.format
    (so `{{` is a literal brace); sparkrun fills `{name}` words and leaves other braces (inline JSON) alone."""
    if sparkrun:
        used = set(_PLACEHOLDER_RE.findall(command))
        missing = sorted(used - set(values))
        if missing:
            raise InventoryError(f"placeholder {{{missing[0]}}} has no value in defaults", file=file, field="command")
        return _PLACEHOLDER_RE.sub(lambda m: _text(values[m.group(1)]), command), used
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(command) if name is not None}
        missing = sorted(used - set(values))
        if missing:
            raise InventoryError(f"placeholder {{{missing[0]}}} has no value in defaults", file=file, field="command")
        return command.format_map({k: _text(v) for k, v in values.items()}), used
    except (ValueError, IndexError) as err:  # a lone brace, a conversion the kit's runner would refuse as well
        raise InventoryError(f"not a str.format template ({err}); write a literal brace as {{{{", file=file,
                             field="command") from None


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _words(text: str, file: str) -> list[str]:
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as err:
        raise InventoryError(f"cannot split the command into words: {err}", file=file, field="command") from None


def _split_serve(words: list[str], file: str) -> tuple[list[str], str | None, list[tuple[str, list[str]]]]:
    """(words before `vllm serve`, the model word, [(flag, the words up to the next flag)]); _Builder then
    reads each flag's value with the catalogue."""
    for i in range(len(words) - 1):
        if words[i].rsplit("/", 1)[-1] == "vllm" and words[i + 1] == "serve":
            rest = words[i + 2:]
            model = rest.pop(0) if rest and not rest[0].startswith("-") else None
            return words[:i], model, _pairs(rest)
    raise InventoryError("no `vllm serve` in the command; sparkdeploy imports vLLM recipes", file=file,
                         field="command")


def _pairs(rest: list[str]) -> list[tuple[str, list[str]]]:
    """Flags and the words after each until the next flag (`--flag=value`: that value)."""
    out: list[tuple[str, list[str]]] = []
    for word in rest:
        if word.startswith("-") and not _is_number(word):
            flag, eq, inline = word.partition("=")
            out.append((flag, [inline] if eq else []))
        elif out:
            out[-1][1].append(word)
        else:
            out.append(("", [word]))
    return out


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _description(raw: dict, sparkrun: bool, model_id: str) -> str:
    meta = raw.get("metadata") if sparkrun else None
    text = (meta or {}).get("description") if isinstance(meta, dict) else raw.get("description") or raw.get("name")
    return str(text or f"{model_id}, imported from a recipe").strip()


class _Builder:
    """Sorts the command's flags into the profile's fields, the inventory's, the kit's own and engine_args."""

    def __init__(self, series: str, file: str):
        self.series, self.file = series, file
        self.flags = engine_args.catalogue(series)
        self.model: str | None = None
        self.served_name: str | None = None
        self.max_model_len: int | None = None
        self.checkpoint_format: str | None = None
        self.parallel: dict[str, Any] = {}
        self.engine: dict[str, Any] = {}
        self.speculative: dict[str, Any] = {}
        self.engine_args: dict[str, Any] = {}
        self.inventory: list[str] = []
        self.unmapped: list[str] = []
        self.notes: list[str] = []
        self.unknown: list[str] = []

    def fail(self, flag: str, message: str) -> None:
        raise InventoryError(message, file=self.file, field=f"command {flag}")

    def fail_on_unknown(self) -> None:
        if self.unknown:
            raise InventoryError(f"vLLM {self.series} has no flag {', '.join(self.unknown)}: the recipe is for another "
                                 "vLLM build (its container); import it for the vLLM that has them "
                                 "(--vllm-version) or remove them from the recipe", file=self.file, field="command")

    def add(self, flag: str, words: list[str]) -> None:
        if not flag:
            self.fail(words[0], f"{words[0]!r} follows `vllm serve MODEL` without a flag")
        flag = SHORT_FLAGS.get(flag, flag)
        spec = self.flags.get(flag)
        if spec is None:
            self.unknown.append(flag)
            return
        dest = spec["dest"]
        if not spec["takes_value"]:
            if words:
                self.fail(flag, f"{flag} is a switch but is followed by {shlex.join(words)!r}")
            on = not flag.startswith(("--no-", "--disable-"))
            self._switch(flag, dest, on)
            return
        if not words:
            self.fail(flag, f"{flag} takes a value")
        value: Any = words if spec["many"] and len(words) > 1 else " ".join(words)
        if len(words) > 1 and not spec["many"]:
            self.fail(flag, f"{flag} takes one value, got {shlex.join(words)!r}")
        self._value(flag, dest, value)

    def add_default(self, key: str, value: Any) -> None:
        """A `defaults` key of a command-less sparkrun recipe: the flag of its name (`tensor_parallel`: -tp), as
        sparkrun renders it; a key no vLLM flag has is listed (a setting of sparkrun's own)."""
        flag = _STRUCTURED_FLAGS.get(key, "--" + key.replace("_", "-"))
        spec = self.flags.get(SHORT_FLAGS.get(flag, flag))
        if spec is None:
            self.unmapped.append(f"defaults.{key}: {_text(value)} (no vllm serve flag {flag}; sparkrun's own setting)")
        elif not spec["takes_value"]:
            if not isinstance(value, bool):
                self.fail(flag, f"defaults.{key} is a switch ({flag}): use true or false")
            self._switch(SHORT_FLAGS.get(flag, flag), spec["dest"], value, spelled=False)
        else:
            many = isinstance(value, list) and spec["many"]
            self.add(flag, [_text(v) for v in value] if many else [_text(value)])

    def _switch(self, flag: str, dest: str, on: bool, spelled: bool = True) -> None:
        if dest == "enable_prefix_caching":
            self.engine["prefix_caching"] = on
        elif dest == "enforce_eager":
            self.engine["enforce_eager"] = on
        elif dest == "enable_expert_parallel":
            self.parallel["expert_parallel"] = on
        elif dest in engine_args.OWNED:
            self.notes.append(f"{flag}: {engine_args.OWNED[dest]}")
        else:  # a flag of the command is on as written; a default renders true or the pin's "off" spelling
            self.engine_args[flag[2:]] = True if spelled else on

    def _value(self, flag: str, dest: str, value: Any) -> None:
        if dest == "model":
            self.model = value
        elif dest == "served_model_name":
            self.served_name = value[0] if isinstance(value, list) else value
        elif dest == "max_model_len":
            self.max_model_len = self.engine["max_model_len"] = self._int(flag, value)
        elif dest in _ENGINE_FIELDS:
            self.engine[_ENGINE_FIELDS[dest]] = self._int(flag, value)
        elif dest in _PARALLEL_FIELDS:
            self.parallel[_PARALLEL_FIELDS[dest]] = self._int(flag, value)
        elif dest == "kv_cache_dtype":
            if value in KV_DTYPES:
                self.engine["kv_cache_dtype"] = value
            else:
                self.unmapped.append(f"{flag} {value}: not a KV dtype a profile takes ({', '.join(KV_DTYPES)}); "
                                     "the engine's default is used")
        elif dest == "speculative_config":
            self._speculative_json(flag, value)
        elif dest in _SPEC_FLAGS:
            key = _SPEC_FLAGS[dest]
            self.speculative[key] = self._int(flag, value) if key == "num_speculative_tokens" else value
        elif dest == "quantization":
            if value in checkpoint.KNOWN_FORMATS:
                self.checkpoint_format = value
            else:
                self.notes.append(f"{flag} {value}: the checkpoint's own config on the head decides the quantization")
        elif dest == "port":
            port = self._int(flag, value)
            if not 1 <= port <= 65535:
                self.fail(flag, f"{flag} {port} is not a port 1..65535")
            self.inventory.append(f"ports.api: {port} (the recipe's {flag})")
        elif dest == "gpu_memory_utilization":
            try:
                gmu = float(value)
            except ValueError:
                gmu = math.nan
            if not 0 < gmu < 1:
                self.fail(flag, f"{flag} takes a fraction between 0 and 1, not {str(value)[:60]!r}")
            self.inventory.append(f"memory.gpu_memory_utilization: {gmu:g} (the recipe's {flag}; unset, the kit "
                                  "derives one from each node's memory)")
        elif dest == "distributed_executor_backend":
            if value in ("ray", "mp"):
                self.inventory.append(f"backend: {value} (the recipe's {flag})")
            else:
                self.unmapped.append(f"{flag} {value}: the kit's backends are mp and ray")
        elif dest in ("api_key", "hf_token"):
            self.fail(flag, f"{flag} puts a secret in argv, where every process sees it; give it as the "
                            f"inventory's {engine_args.OWNED[dest].split(' ')[0]} instead")
        elif dest in engine_args.OWNED:
            self.notes.append(f"{flag} {value}: {engine_args.OWNED[dest]}")
        else:
            self.engine_args[flag[2:]] = value

    def _int(self, flag: str, value: Any) -> int:
        text = str(value).strip().lower()
        scale = {"k": 1000, "m": 1000 ** 2}.get(text[-1:], 1)  # vLLM's human_readable_int: 8k = 8000
        try:
            return int(float(text[:-1] if scale > 1 else text) * scale)
        except (ValueError, OverflowError):  # not a number, or infinity
            self.fail(flag, f"{flag} takes an integer, not {str(value)[:60]!r}")
        raise AssertionError  # unreachable: fail raises

    def _speculative_json(self, flag: str, value: str) -> None:
        try:
            spec = json.loads(value)
        except ValueError:
            self.fail(flag, f"{flag}: {value[:60]!r} is not JSON")
        if not isinstance(spec, dict) or "method" not in spec:
            self.fail(flag, f"{flag}: expected a JSON object with method and num_speculative_tokens")
        for key, item in spec.items():
            if isinstance(item, (dict, list)) or item is None:
                self.unmapped.append(f"{flag} key {key}: {json.dumps(item)} (a profile's speculative keys are "
                                     "scalars)")
            else:
                self.speculative[key] = item
