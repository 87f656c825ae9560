"""Behaviour probes for ``check``: run the pin's own code for the decision each patch depends on, on CPU.

A name check proves a function exists; it does not prove that the runner still keeps our draft head. So
each probe takes the *definitions* the patch relies on out of the pin's source files (``check.Source``),
compiles them with their real file names, and runs them with torch on CPU on tiny modules and tensors.
Only what a GPU or a whole engine would provide is stubbed, and each probe says what: model loading
(``get_model`` returns a tiny draft), the pipeline-parallel group (size 1), config plumbing (identity),
the device capability (GB10, ``(12, 1)``) and the CuTe kernel's availability.

Verdicts: ``ok`` (the decision is as relied on), ``drift`` (it ran and decided otherwise: a failed
probe stops the image build) and ``unproven`` (it could not run here: a definition is missing or needs
more than CPU torch; the patch stays off unless the profile forces it).
"""

from __future__ import annotations

import __future__
import ast
import contextlib
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

OK, DRIFT, UNPROVEN = "ok", "drift", "unproven"
GB10 = (12, 1)


class ProbeFailed(Exception):
    """The pin's code ran and decided otherwise than the patch relies on."""


@dataclass(frozen=True)
class Verdict:
    feature: str
    probe: str
    status: str
    detail: str = ""


def _strip_imports(fn: ast.AST, stubs: dict) -> None:
    """Function-local ``from vllm... import X`` become ``X = __stubs__['X']`` (a GPU-free stand-in)."""
    for node in ast.walk(fn):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.ImportFrom) and all((a.asname or a.name) in stubs for a in stmt.names):
                body[i] = ast.parse("; ".join(f"{a.asname or a.name} = __stubs__[{(a.asname or a.name)!r}]"
                                              for a in stmt.names)).body[0]


def load(src, module: str, qualnames: Iterable[str], namespace: dict) -> dict:
    """Compile the named definitions from ``module`` of the pin into ``namespace`` (returned).

    ``Name`` is a top-level def, ``Class.method`` a method (compiled as a plain function, called with a
    stand-in ``self``). Annotations are not evaluated. A missing definition raises ``LookupError``."""
    namespace.setdefault("__stubs__", {})
    for qualname in qualnames:
        head, _, attr = qualname.partition(".")
        hit = src.lookup(module, head)
        if hit is None or hit[0] == "import":
            raise LookupError(f"{module}.{head} not found")
        node = hit[1]
        if attr:
            node = src.member(hit[0], node, attr) if isinstance(node, ast.ClassDef) else None
            if node is None:
                raise LookupError(f"{module}.{qualname} not found")
        node = ast.parse(ast.unparse(node)).body[0]  # a private copy to rewrite
        _strip_imports(node, namespace["__stubs__"])
        code = compile(ast.Module(body=[node], type_ignores=[]), str(src.path(hit[0])), "exec",
                       flags=__future__.annotations.compiler_flag, dont_inherit=True)
        exec(code, namespace)  # noqa: S102 - the pin's own definition, the point of the probe
        if attr:
            namespace[qualname] = namespace.pop(node.name)
    return namespace


def _base(**stubs) -> dict:
    import torch

    ns = {"torch": torch, "nn": torch.nn, "Literal": Literal, "Iterable": Iterable, "Any": Any,
          "__stubs__": stubs}
    ns.update(stubs)
    return ns


# ------------------------------------------------------------------------------------------- shortlist
def _tiny_pair():
    import torch

    target = torch.nn.Module()
    target.lm_head = torch.nn.Linear(4, 16, bias=False)
    target.model = torch.nn.Module()
    draft = torch.nn.Module()
    draft.lm_head = torch.nn.Linear(4, 3, bias=False)  # the shortlist head: 3 rows of 16
    draft.model = torch.nn.Module()
    draft.has_own_lm_head = True
    return target, draft


def probe_runner_keeps_draft_head(src) -> None:
    """The V2 MTP speculator, loading a draft that declares its own head, leaves that head in place
    (``MTPSpeculator.load_draft_model`` -> ``load_eagle_model`` -> the sharing decision). Stubbed:
    ``get_model`` (returns the tiny draft), the PP group (size 1), config plumbing (identity)."""
    utils = "vllm.v1.worker.gpu.spec_decode.eagle.utils"
    target, draft = _tiny_pair()
    own = draft.lm_head

    class PP:
        world_size = 1

    ns = _base(replace=lambda cfg, **kw: cfg, get_pp_group=lambda: PP(), BaseLayerWithLoRA=type("L", (), {}),
               PPMissingLayer=type("P", (), {}), quantized_lm_head_copy=lambda head, q: head,
               get_model=lambda **kw: draft, get_draft_load_config=lambda cfg: cfg.load_config,
               get_pp_safe_draft_load_config=lambda cfg: cfg, set_model_tag=lambda tag: contextlib.nullcontext())
    names = [n.name for n in src.tree(utils).body if isinstance(n, ast.FunctionDef)]
    load(src, utils, names, ns)
    load(src, "vllm.v1.worker.gpu.spec_decode.mtp.speculator", ["MTPSpeculator.load_draft_model"], ns)
    spec = types.SimpleNamespace(draft_model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace()),
                                 apply_draft_overrides=lambda cfg: cfg, draft_lm_head_quantization=None)
    cfg = types.SimpleNamespace(speculative_config=spec, load_config=object(),
                                parallel_config=types.SimpleNamespace(prefill_context_parallel_size=1))
    speculator = types.SimpleNamespace(vllm_config=cfg)
    got = ns["MTPSpeculator.load_draft_model"](speculator, target, set())
    if got is not draft or got.lm_head is not own:
        raise ProbeFailed("MTPSpeculator.load_draft_model replaced the draft's own lm_head (has_own_lm_head=True) "
                          "with the target's: the shortlist head would never be used")
    del draft.has_own_lm_head  # the control: a stock draft must share, else the probe proves nothing
    draft.lm_head = type(own)(4, 16, bias=False)
    if ns["MTPSpeculator.load_draft_model"](speculator, target, set()).lm_head is not target.lm_head:
        raise ProbeFailed("a stock MTP draft no longer shares the target's lm_head: the sharing decision changed")


def probe_loader_keeps_lm_head(src, classes: tuple[str, ...]) -> None:
    """Each MTP class's ``load_weights`` hands ``lm_head.*`` to the weight loader (the shortlist gathers its rows
    there). Stubbed: ``AutoWeightsLoader`` records the names it is given."""
    for where in classes:
        module, _, cls = where.partition(":")
        seen: list[str] = []

        class Recorder:
            def __init__(self, model, **kw):
                pass

            def load_weights(self, weights, **kw):
                seen.extend(name for name, _ in weights)
                return set(seen)

        ns = _base(AutoWeightsLoader=Recorder)
        load(src, module, [f"{cls}.load_weights", f"{cls}.is_unused_checkpoint_weight"], ns)
        model = types.SimpleNamespace()
        model.is_unused_checkpoint_weight = lambda name, _f=ns[f"{cls}.is_unused_checkpoint_weight"]: _f(model, name)
        import torch

        w = torch.zeros(1)
        ns[f"{cls}.load_weights"](model, iter([("lm_head.weight", w), ("mtp.fc.weight", w)]))
        if not any(name.endswith("lm_head.weight") for name in seen):
            raise ProbeFailed(f"{cls}.load_weights drops lm_head.* (the loader got {seen}): the shortlist head "
                              "would stay uninitialised")


def probe_qwen4_remap_keeps_lm_head(src) -> None:
    """Qwen4ExpMTP maps the checkpoint's head names to ``lm_head.*`` rather than dropping them."""
    ns = load(src, "vllm.models.qwen4_exp.nvidia.mtp", ["_remap_mtp_weight_name"], _base())
    for name in ("lm_head.weight", "mtp.shared_head.head.weight"):
        if ns["_remap_mtp_weight_name"](name) != "lm_head.weight":
            raise ProbeFailed(f"_remap_mtp_weight_name({name!r}) is not 'lm_head.weight': the head is dropped")


def probe_draft_head_maps_ids_back(src) -> None:
    """The pin's ``LocalArgmaxMixin.get_top_tokens`` over our shortlist head (S rows, ``d2t`` from
    ``vocab_list``) returns target-vocabulary ids equal to the argmax of the full logits restricted to the
    list; our scatter puts -inf outside it. Stubbed: the TP=1 ``LogitsProcessor.get_top_tokens`` (an argmax)."""
    import numpy as np
    import torch

    from . import vocab_list
    from .shortlist_math import scatter_to_vocab

    ns = load(src, "vllm.model_executor.models.interfaces", ["LocalArgmaxMixin.get_top_tokens"], _base())
    ids = [1, 5, 6, 11, 14]
    full = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    head = types.SimpleNamespace(weight=full[ids])
    model = types.SimpleNamespace(lm_head=head, draft_id_to_target_id=torch.as_tensor(vocab_list.d2t_offsets(np.array(ids))),
                                  logits_processor=types.SimpleNamespace(
                                      get_top_tokens=lambda lm_head, h: (h @ lm_head.weight.T).argmax(-1)))
    hidden = torch.randn(7, 4, generator=torch.Generator().manual_seed(2))
    got = ns["LocalArgmaxMixin.get_top_tokens"](model, hidden)
    logits = hidden @ full.T
    want = torch.tensor(ids)[logits[:, ids].argmax(-1)]
    if not torch.equal(got, want):
        raise ProbeFailed(f"LocalArgmaxMixin.get_top_tokens returned {got.tolist()}, not the listed ids "
                          f"{want.tolist()}: draft ids are not mapped back through draft_id_to_target_id")
    scattered = scatter_to_vocab(hidden @ head.weight.T, torch.tensor(ids), 16)
    if not torch.equal(scattered.argmax(-1), want):
        raise ProbeFailed("the scattered shortlist logits do not pick the listed ids")


# ------------------------------------------------------------------------------------------- skinny GEMM
PLAN_MODULE_034 = "vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm_plans"
KERNEL_MODULE = "vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm"


def load_plan_table(src) -> dict:
    """The pin's plan module, run with its kernel import stubbed: ``SkinnyGemmConfig`` is the pin's own
    dataclass; the kernel reports itself available and the device is a GB10."""
    import dataclasses

    ns = load(src, KERNEL_MODULE, ["SkinnyGemmConfig"], {"dataclass": dataclasses.dataclass,
                                                            "dataclasses": dataclasses})
    tree = src.tree(PLAN_MODULE_034)
    if tree is None:
        raise LookupError(f"{PLAN_MODULE_034} not found")
    plans = {"SkinnyGemmConfig": ns["SkinnyGemmConfig"],
             "shape_dynamic_skinny_gemm": types.SimpleNamespace(is_available=lambda: True),
             "current_platform": types.SimpleNamespace(get_device_capability=lambda: GB10)}
    body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(src.path(PLAN_MODULE_034)), "exec"), plans)  # noqa: S102
    return plans


def probe_plan_lookup(src) -> None:
    """Our entries, added through the pin's table (``skinny_plans.extend_upstream_table``), are what the pin's
    ``get_skinny_gemm_plan`` returns for our shapes at M=1..5, as the pin's ``SkinnyGemmConfig``."""
    from . import skinny_plans
    
    plans = load_plan_table(src)
    table = plans["SKINNY_GEMM_PLANS_BY_CAPABILITY"][GB10]
    added = skinny_plans.extend_upstream_table(table, plans["SkinnyGemmConfig"], skinny_plans.SM121, only=None)
    for (n, k), by_m in skinny_plans.SM121.items():
        got = plans["get_skinny_gemm_plan"](n, k) or {}
        for m, plan in by_m.items():
            cfg = got.get(m)
            if (n, k, m) in added and (cfg is None or (cfg.num_rows, cfg.block_size, cfg.outputs_per_block,
                                                       cfg.k_unroll, cfg.vector_width, cfg.static_k)
                                       != (m, plan.block_size, plan.outputs_per_block, plan.k_unroll,
                                           plan.vector_width, plan.static_k)):
                raise ProbeFailed(f"get_skinny_gemm_plan({n}, {k}) does not return our M={m} entry ({cfg}): "
                                  "the plan lookup changed")
    if not added:
        raise ProbeFailed("no entry of ours could be added to the pin's table")


# ------------------------------------------------------------------------------------------- configs
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "use_local_argmax_reduction")
SPECULATIVE_KEYS_033 = SPECULATIVE_KEYS + ("draft_lm_head_quantization",)  # the planner sets it from 0.33 on


def probe_config_keys(src, keys: tuple[str, ...]) -> None:
    """Every key the kit renders into ``--speculative-config`` is a field of the pin's ``SpeculativeConfig``,
    and ``additional_config`` one of ``VllmConfig`` (static: the pydantic classes need the whole engine)."""
    for module, cls, keys in (("vllm.config.speculative", "SpeculativeConfig", keys),
                              ("vllm.config.vllm", "VllmConfig", ("additional_config",))):
        hit = src.lookup(module, cls)
        if hit is None or not isinstance(hit[1], ast.ClassDef):
            raise LookupError(f"{module}.{cls} not found")
        fields = {n.target.id for n in hit[1].body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        missing = [k for k in keys if k not in fields]
        if missing:
            raise ProbeFailed(f"{cls} has no field {missing[0]!r}: the rendered config would be rejected")


# ------------------------------------------------------------------------------------------- table
Probe = tuple[str, Callable[[Any], None]]


def probes(series: str) -> dict[str, list[Probe]]:
    """Per feature, the probes that decide it on this pin series."""
    mtp = ("vllm.model_executor.models.qwen3_next_mtp:Qwen3NextMTP", "vllm.model_executor.models.qwen3_5_mtp:Qwen3_5MTP")
    keys = SPECULATIVE_KEYS if series == "0.32" else SPECULATIVE_KEYS_033
    shortlist: list[Probe] = [
        ("runner keeps the draft's own head", probe_runner_keeps_draft_head),
        ("MTP loaders keep lm_head.*", lambda s: probe_loader_keeps_lm_head(s, mtp)),
        ("draft head maps ids back", probe_draft_head_maps_ids_back),
        ("speculative/additional config keys accepted", lambda s: probe_config_keys(s, keys)),
    ]
    if series != "0.32":  # Qwen4ExpMTP arrived in 0.33
        shortlist.append(("Qwen4ExpMTP keeps lm_head.*", probe_qwen4_remap_keeps_lm_head))
    out = {"shortlist": shortlist, "fp8_gdn": [], "prefix_align": [], "capture": []}
    out["skinny_gemm"] = [("plan lookup returns our entries", probe_plan_lookup)] if series == "0.34" else []
    return out


def run(src, series: str, features: Iterable[str]) -> list[Verdict]:
    """Run every probe of ``features``; an exception other than :class:`ProbeFailed` makes it unproven. The
    global RNG is left as found (the probes also run inside the engine, ``installed_gate``)."""
    import torch

    out = []
    table = probes(series)
    for feature in features:
        for name, fn in table.get(feature, []):
            try:
                with torch.random.fork_rng(devices=[]):
                    fn(src)
                out.append(Verdict(feature, name, OK))
            except ProbeFailed as e:
                out.append(Verdict(feature, name, DRIFT, str(e)))
            except Exception as e:  # noqa: BLE001 - could not run here: unproven, never ok
                out.append(Verdict(feature, name, UNPROVEN, f"{type(e).__name__}: {e}"))
    return out


_installed: dict[str, list[Verdict]] = {}  # feature -> its probes that did not pass on the installed vLLM


def installed_gate(feature: str, force: bool) -> str:
    """Why ``feature`` must stay off in this process ("" = it may run): its probes, run once per process against
    the installed vLLM's own files. A drifted probe always keeps it off (the image build should have stopped);
    an unproven one unless the settings force it."""
    if feature not in _installed:
        from . import check, compat

        try:
            root = check.find_vllm_root(None)
            verdicts = run(check.Source(root), compat.series(check.read_version(root)), [feature])
        except Exception as e:  # noqa: BLE001 - no vLLM to read, an unknown version: nothing proven
            verdicts = [Verdict(feature, "read the installed vLLM", UNPROVEN, f"{type(e).__name__}: {e}")]
        _installed[feature] = [v for v in verdicts if v.status != OK]
    bad = _installed[feature]
    if not bad or (force and all(v.status == UNPROVEN for v in bad)):
        return ""
    why = "; ".join(f"probe '{v.probe}' {v.status}: {v.detail}" for v in bad)
    return why + ("" if any(v.status == DRIFT for v in bad) else " (settings 'force': true runs it unproven)")
