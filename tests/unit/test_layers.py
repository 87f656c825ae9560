"""The package's layers, written down once: a module may import from its own layer and the ones below it,
never from a layer above, and no import cycle exists anywhere (function-level imports included: a cycle
hidden inside a function is still a cycle). A new module must be placed here to pass."""

from __future__ import annotations

import ast
from pathlib import Path

import sparkdeploy

PACKAGE = Path(sparkdeploy.__file__).parent

# lowest first; an entry names a module or a package (every module under it)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base: pure helpers, types, on-node names, parsers", (
        "sparkdeploy", "errors", "extras", "paths", "timing", "yamlfile", "layout", "verdict", "sshconfig", "faults",
        "checkpoint",
        "credentials", "facts", "probes", "memory", "memguard", "engine_args", "served_tokenizer", "vocab",
        "bench.stats", "bench.metrics", "bench.prompts", "bench.compare", "bench.results", "bench.report",
        "model_fetch_node", "weights_node", "steps.node_files")),
    ("model: the inventory and the profile it names", ("fields", "profile", "topology", "inventory", "recipe")),
    ("planning core: inventory + facts -> plan -> files (no I/O on nodes)", ("plan", "render", "router")),
    ("remote: connections", ("connection", "remote", "streams")),
    ("node effects and reads", (
        "gather", "releases", "registry", "vocab_live", "weights", "health", "hostsetup", "model_fetch")),
    ("steps: the idempotent remote steps and the verbs built on them", ("steps",)),
    ("procedures on a deployed cluster", (
        "rollout", "rollout_checks", "rollout_live", "doctor", "preflight", "init", "bench.client", "bench.run", "bench.probe", "bench.harness",
        "bench.turn2", "bench.context", "bench.sentinel", "bench", "exporter")),
    ("front: the command line and the simulated cluster", ("cli", "__main__", "sim")),
]


def modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import sparkdeploy.x.y` names x.y, or an attribute of a module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def layer_of(name: str) -> int:
    short = name.removeprefix("sparkdeploy").removeprefix(".") or "sparkdeploy"
    best, best_len = None, -1
    for i, (_, entries) in enumerate(LAYERS):
        for e in entries:
            if (short == e or short.startswith(e + ".")) and len(e) > best_len:
                best, best_len = i, len(e)
    assert best is not None, f"{name} is in no layer: place it in LAYERS in {__file__}"
    return best


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports_of(n, p, set(mods)) for n, p in mods.items()}


def test_every_module_has_a_layer_and_imports_only_downwards():
    bad = []
    for mod, deps in graph().items():
        for dep in deps:
            if dep != "sparkdeploy" and layer_of(dep) > layer_of(mod):
                bad.append(f"{mod} ({LAYERS[layer_of(mod)][0].split(':')[0]}) imports {dep} "
                           f"({LAYERS[layer_of(dep)][0].split(':')[0]})")
    assert not bad, "imports from a layer above:\n" + "\n".join(sorted(bad))


def test_no_import_cycle():
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g[v] - {"sparkdeploy"}:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_a_function_level_upward_import(tmp_path):
    """The walk must see imports inside functions, or a hidden cycle would pass."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from sparkdeploy.steps import deploy\n    import sparkdeploy.plan\n")
    known = {"sparkdeploy.steps.deploy", "sparkdeploy.steps", "sparkdeploy.plan", "sparkdeploy.memory"}
    assert imports_of("sparkdeploy.memory", f, known) == {"sparkdeploy.steps.deploy", "sparkdeploy.plan"}
