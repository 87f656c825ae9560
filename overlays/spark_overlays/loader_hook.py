"""Run the skinny-GEMM overlay around every model vLLM loads: target and draft.

On a pin with its own plan table (``compat.PLAN_TABLE_MODULE``) our entries go into that table before the
model is built (upstream marks the layers at load); on older pins our kernel swap runs after the load.

Wraps ``BaseModelLoader.load_model`` at class level once per process; ``get_model`` goes through it for
the target model and for the MTP draft (both runners). An error in the overlay is logged and the
loaded model is returned unchanged (fail closed).
"""

from __future__ import annotations

from ._util import fail_closed

_state = {"installed": False}


def install() -> None:
    if _state["installed"]:
        return
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    original = BaseModelLoader.load_model
    if getattr(original, "_spark_overlay", False):
        _state["installed"] = True
        return

    from vllm import __version__

    from . import compat

    plan_module = compat.PLAN_TABLE_MODULE.get(compat.series(__version__))

    def load_model(self, vllm_config, model_config, *args, **kwargs):
        if plan_module:
            before_load(vllm_config, plan_module)
        model = original(self, vllm_config, model_config, *args, **kwargs)
        if not plan_module:
            after_load(model, vllm_config)
        return model

    load_model._spark_overlay = True  # type: ignore[attr-defined]
    load_model.__wrapped__ = original  # type: ignore[attr-defined]
    BaseModelLoader.load_model = load_model
    _state["installed"] = True


def before_load(vllm_config, plan_module: str) -> None:
    from . import skinny_gemm

    try:
        skinny_gemm.extend_pin_table(vllm_config, plan_module)
    except Exception as e:  # noqa: BLE001 - fail closed: upstream's table stays as shipped
        fail_closed("skinny_gemm", f"{type(e).__name__}: {e}")


def after_load(model, vllm_config) -> None:
    from . import skinny_gemm

    try:
        skinny_gemm.enable(model, vllm_config)
    except Exception as e:  # noqa: BLE001 - fail closed, keep the loaded model
        fail_closed("skinny_gemm", f"{type(e).__name__}: {e}")
