"""``python -m spark_overlays check``: does this vLLM still have, and still do, everything compat.py relies on?

Two passes over the vLLM sources, neither imports ``vllm``, so it works on the installed package (found
with ``importlib.util.find_spec``, no import) and on an unpacked wheel or checkout (``--vllm-source DIR``)
alike, with or without CUDA: the targets are parsed with ``ast`` (existence, leading parameters, code
fragments), then ``probes`` runs the pin's own definitions on CPU for each patch's decision. The version
comes from ``vllm/_version.py``. Exit status: 0 every target found and no probe drifted, 1 drift (each
target or probe named with its patch), 2 unusable input (no vLLM, unsupported version). A probe that
cannot run here is reported ``UNPROVEN``: the patch stays off unless the profile forces it.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from . import compat, probes


class CheckError(Exception):
    """No vLLM to check, or a version compat does not know."""


@dataclass
class Result:
    feature: str
    target: compat.Target
    ok: bool
    detail: str = ""


def find_vllm_root(source: str | None = None) -> Path:
    """The ``vllm`` package directory: inside ``source`` (or ``source`` itself), else the installed one."""
    if source:
        p = Path(source)
        for cand in (p / "vllm", p):
            if (cand / "__init__.py").is_file() and (cand / "model_executor").is_dir():
                return cand
        raise CheckError(f"{source}: no vllm package (expected {p / 'vllm' / '__init__.py'})")
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise CheckError("vllm is not installed in this Python; pass --vllm-source DIR")
    return Path(list(spec.submodule_search_locations)[0])


def read_version(root: Path) -> str:
    vf = root / "_version.py"
    if vf.is_file():
        m = re.search(r"""^__version__\s*(?::\s*str\s*)?=\s*version\s*=\s*['"]([^'"]+)['"]""", vf.read_text(), re.M) \
            or re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", vf.read_text(), re.M)
        if m:
            return m.group(1)
    raise CheckError(f"{root}: cannot read the vLLM version from _version.py")


class Source:
    """Parsed modules of one vLLM tree, by dotted name."""

    def __init__(self, root: Path):
        self.root = root
        self._cache: dict[str, ast.Module | None] = {}
        self.accessed: set[Path] = set()  # files read, so tests can copy a minimal tree

    def path(self, module: str) -> Path | None:
        parts = module.split(".")
        if parts[0] != "vllm":
            return None
        base = self.root.joinpath(*parts[1:])
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._cache:
            p = self.path(module)
            if p is not None:
                self.accessed.add(p)
            self._cache[module] = ast.parse(p.read_text(), str(p)) if p else None
        return self._cache[module]

    # --------------------------------------------------------------- name resolution
    @staticmethod
    def _resolve_from(module: str, node: ast.ImportFrom, is_pkg: bool) -> str:
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        base = parts if is_pkg else parts[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def lookup(self, module: str, name: str, depth: int = 0):
        """(module, ast node) defining ``name`` at top level of ``module``, following from-imports."""
        tree = self.tree(module)
        if tree is None or depth > 6:
            return None
        is_pkg = self.path(module).name == "__init__.py"  # type: ignore[union-attr]
        found = None
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                found = (module, node)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = (module, node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                found = (module, node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        src = self._resolve_from(module, node, is_pkg)
                        hit = self.lookup(src, alias.name, depth + 1)
                        found = hit or ("import", f"{src}.{alias.name}")
        return found

    def member(self, module: str, cls: ast.ClassDef, attr: str, depth: int = 0):
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == attr:
                return node
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
                return node
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == attr:
                return node
        if depth > 6:
            return None
        for base in cls.bases:  # inherited members, bases resolved through the defining module
            if isinstance(base, ast.Name):
                hit = self.lookup(module, base.id)
                if hit and isinstance(hit[1], ast.ClassDef):
                    got = self.member(hit[0], hit[1], attr, depth + 1)
                    if got is not None:
                        return got
        return None


def _params(fn) -> list[str]:
    a = fn.args
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def _code(node) -> str:
    """The definition's source as ``ast.unparse`` writes it, docstring dropped, whitespace collapsed."""
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
            and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        node = copy.copy(node)
        node.body = body[1:] or [ast.Pass()]
    return " ".join(ast.unparse(node).split())


def check_target(src: Source, t: compat.Target) -> tuple[bool, str]:
    if src.tree(t.module) is None:
        return False, f"module {t.module} not found"
    if not t.qualname:
        return True, ""
    head, _, attr = t.qualname.partition(".")
    hit = src.lookup(t.module, head)
    if hit is None:
        return False, f"{head} not defined in {t.module}"
    mod, node = hit
    if mod == "import":
        return (t.params is None and not attr), f"{head} imported from {node}, not found there"
    if attr:
        if not isinstance(node, ast.ClassDef):
            return False, f"{t.module}.{head} is not a class"
        node = src.member(mod, node, attr)
        if node is None:
            return False, f"{head}.{attr} not found in {t.module} (or its bases)"
    if t.params is not None:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False, f"{t.qualname} is not a function"
        got = _params(node)
        if got[: len(t.params)] != list(t.params):
            return False, f"{t.qualname} signature changed: expected ({', '.join(t.params)}, ...), found ({', '.join(got)})"
    missing = [c for c in t.code if c not in _code(node)]
    if missing:
        return False, f"{t.qualname} no longer contains {missing[0]!r} (the behaviour the overlay relies on)"
    return True, ""


def run_check(source: str | None = None, features=compat.FEATURES, _src_out: list | None = None
              ) -> tuple[str, list[Result]]:
    """The static pass: every target of ``features`` for the tree's version."""
    root = find_vllm_root(source)
    version = read_version(root)
    try:
        compat.series(version)
    except compat.CompatError as e:
        raise CheckError(str(e)) from None
    src = Source(root)
    if _src_out is not None:
        _src_out.append(src)
    results = []
    for feature, target in compat.targets(version, tuple(features)):
        ok, detail = check_target(src, target)
        results.append(Result(feature, target, ok, detail))
    return version, results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark_overlays check", description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-source", help="a vLLM source tree or unpacked wheel (default: the installed vllm)")
    ap.add_argument("--feature", action="append", choices=compat.FEATURES, help="limit to these features")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    features = tuple(args.feature or compat.FEATURES)
    try:
        holder: list = []
        version, results = run_check(args.vllm_source, features, _src_out=holder)
    except CheckError as e:
        print(f"spark_overlays check: {e}", file=sys.stderr)
        return 2
    verdicts = probes.run(holder[0], compat.series(version), features)
    bad = [r for r in results if not r.ok]
    drifted = [v for v in verdicts if v.status == probes.DRIFT]
    unproven = [v for v in verdicts if v.status == probes.UNPROVEN]
    if args.json:
        print(json.dumps({"vllm_version": version, "ok": not bad and not drifted,
                          "features": {f: compat.mode(version, f) for f in compat.FEATURES},
                          "drift": [{"feature": r.feature, "target": str(r.target), "detail": r.detail} for r in bad]
                          + [{"feature": v.feature, "probe": v.probe, "detail": v.detail} for v in drifted],
                          "unproven": [{"feature": v.feature, "probe": v.probe, "detail": v.detail} for v in unproven],
                          "checked": len(results), "probes": len(verdicts)}, indent=2))
    else:
        for f in compat.FEATURES:
            print(f"{f:13s} {compat.mode(version, f)}")
        for r in bad:
            print(f"DRIFT {r.feature}: {r.target}: {r.detail}", file=sys.stderr)
        for v in drifted:
            print(f"DRIFT {v.feature}: probe '{v.probe}': {v.detail}", file=sys.stderr)
        for v in unproven:
            print(f"UNPROVEN {v.feature}: probe '{v.probe}' could not run on CPU ({v.detail}); the patch stays off "
                  "unless the profile forces it", file=sys.stderr)
        print(f"spark_overlays check: vLLM {version}: {len(results) - len(bad)}/{len(results)} targets ok, "
              f"{sum(v.status == probes.OK for v in verdicts)}/{len(verdicts)} probes ok"
              + ("" if not (bad or drifted) else f"; {len(bad) + len(drifted)} drifted")
              + ("" if not unproven else f"; {len(unproven)} unproven"))
    return 1 if bad or drifted else 0
