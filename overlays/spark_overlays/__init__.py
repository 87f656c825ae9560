"""spark_overlays: the vLLM plugin carrying sparkdeploy's overlay patches (shortlist, skinny GEMM).

Loaded through the ``vllm.general_plugins`` entry point (``spark_overlays = "spark_overlays:register"``)
in every vLLM process: API server, engine core, each worker, the model-inspection subprocess; sometimes
more than once per process. ``register()`` is idempotent, imports no CUDA-initialising module and does
no device work: it only installs hooks. Each hook reads its switch from the run's ``--additional-config``
when it runs (``VllmConfig.additional_config`` reaches every process and is hashed into the compile
cache; ``SpeculativeConfig`` rejects unknown keys, so settings never go there).

Settings (``--additional-config``; every key optional, a feature is off unless ``enabled`` is true)::

    {"spark_overlays": {
      "shortlist":    {"enabled": true,
                       "path": "/opt/sparkdeploy/vocab/current.txt",   # one id per line, or .npy
                       "sha256": "<sha256 of the file bytes>",         # optional; mismatch = rejected
                       "require_ids": [151643, 151645],                # optional; EOS and the tokenizer's
                                                                       # special tokens are always required
                       "capacity": 65536,          # optional; head rows fixed at start (default: the list's size)
                       "live_check_every": 64},    # optional; drafter calls between looks at the pointer for a
                                                   # live list swap (default 0: none)
      "skinny_gemm":  {"enabled": true, "plans": "auto"},   # plans: on a pin with its own table (0.34),
                                                            # "auto" adds measured entries only, "all" every one
      "fp8_gdn":      {"enabled": false},     # native vLLM flags on every supported pin: no overlay code;
      "prefix_align": {"enabled": false}      # accepted so the planner's table stays uniform
    }}

Unknown keys or features, a list that is unsorted, has duplicates, lies outside the vocabulary, lacks a
required id or fails its hash: that feature fails closed (stock behaviour, reason logged) on every TP
rank together. So does shortlist or skinny_gemm when a behaviour probe (``probes.py``, run once per process
on the installed vLLM's files) drifted, or could not run and the feature's ``"force": true`` is not set.

Files, one per patch: ``shortlist.py`` (+ ``shortlist_qwen35.py``, ``shortlist_qwen4.py``, ``vocab_list.py``,
``shortlist_live.py``: the fixed capacity and the live swap), ``skinny_gemm.py``
(+ ``skinny_plans.py``); ``loader_hook.py`` runs skinny GEMM after each model load; ``compat.py`` says per vLLM version which features are native flags and which are overlays;
``check.py`` (``python -m spark_overlays check``) verifies the installed vLLM or a source tree against it.
"""

from __future__ import annotations

__version__ = "0.1.0"

SHORTLIST_ARCHS = {
    "Qwen3NextMTP": "spark_overlays.shortlist:ShortlistQwen3NextMTP",
    "Qwen3_5MTP": "spark_overlays.shortlist_qwen35:ShortlistQwen3_5MTP",
    "Qwen3_5MoeMTP": "spark_overlays.shortlist_qwen35:ShortlistQwen3_5MoeMTP",
}
SHORTLIST_ARCHS_033 = {"Qwen4ExpMTP": "spark_overlays.shortlist_qwen4:ShortlistQwen4ExpMTP"}

_loaded = {"count": 0, "ok": False}


def register() -> None:
    """vLLM general-plugin entry point. Safe to call many times; never raises."""
    from ._util import fail_closed, info, process_tag

    _loaded["count"] += 1
    if _loaded["count"] > 1:
        info("already loaded (call %d, active=%s) %s", _loaded["count"], _loaded["ok"], process_tag())
        return
    try:
        from vllm import __version__ as vllm_version

        from . import compat

        series = compat.series(vllm_version)
    except Exception as e:  # noqa: BLE001
        fail_closed("all features", f"{type(e).__name__}: {e}")
        return
    done = []
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        archs = dict(SHORTLIST_ARCHS)
        if series != "0.32":
            archs.update(SHORTLIST_ARCHS_033)
        for arch, target in archs.items():
            ModelRegistry.register_model(arch, target)
        done.append("shortlist")
    except Exception as e:  # noqa: BLE001
        fail_closed("shortlist", f"registration failed: {type(e).__name__}: {e}")
    try:
        from . import loader_hook

        loader_hook.install()
        done.append("skinny_gemm")
    except Exception as e:  # noqa: BLE001
        fail_closed("skinny_gemm", f"loader hook failed: {type(e).__name__}: {e}")
    _loaded["ok"] = True
    info("loaded %s on vLLM %s (hooks: %s) %s", __version__, vllm_version, ", ".join(done), process_tag())
