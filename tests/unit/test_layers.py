"""The package's layers, written down once: a module may import from its own layer and the ones below it,
never from a layer above, and no import cycle exists anywhere (function-level imports included: a cycle
hidden inside a function is still a cycle). A new module must be placed here to pass. docs/ARCHITECTURE.md is
checked against the same code: its layer table is LAYERS, its `up` table follows `steps/up._up`, and every repo
path and `module.name` it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import sparkdeploy

PACKAGE = Path(sparkdeploy.__file__).parent

# lowest first; an entry names a module or a package (every module under it)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base: pure helpers, types, on-node names and probes, the code that runs on nodes", (
        "sparkdeploy", "errors", "extras", "fanout", "faults", "paths", "poll", "timing", "verdict", "yamlfile",
        "node", "vocab", "bench.stats", "bench.metrics", "bench.prompts", "bench.compare", "bench.results",
        "bench.report")),
    ("model: the inventory, the profile it names, the checkpoint and the engine arguments", ("model",)),
    ("planning core: inventory + facts -> plan -> files (no I/O on nodes)", ("plan",)),
    ("remote: connections", ("remote",)),
    ("node effects and reads", ("ops",)),
    ("steps: the idempotent remote steps and every verb that changes a cluster, built on them", ("steps",)),
    ("checks and the bench on a deployed cluster", (
        "checks", "bench.client", "bench.run", "bench.probe", "bench.harness", "bench.turn2",
        "bench.context", "bench.sentinel", "bench")),
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
    known = {"sparkdeploy.steps.deploy", "sparkdeploy.steps", "sparkdeploy.plan", "sparkdeploy.plan.memory"}
    assert imports_of("sparkdeploy.plan.memory", f, known) == {"sparkdeploy.steps.deploy", "sparkdeploy.plan"}


# ------------------------------------------------------------------- docs/ARCHITECTURE.md against the code
REPO = PACKAGE.parent.parent
DOC = REPO / "docs" / "ARCHITECTURE.md"


def doc_section(number: int) -> str:
    """The text of ARCHITECTURE.md's section `## <number>. ...`, up to the next `## `."""
    text = DOC.read_text()
    start = re.search(rf"^## {number}\. .*$", text, re.M)
    assert start, f"{DOC} has no section `## {number}. ...`"
    end = re.search(r"^## ", text[start.end():], re.M)
    return text[start.end(): start.end() + end.start() if end else len(text)]


def table_rows(section: str) -> list[list[str]]:
    """The cells of each data row (not a header, not a separator) of the markdown tables in `section`."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
            for line in section.splitlines()]
    rule = [r is not None and all(set(c) <= set("-: ") for c in r) for r in rows]
    return [r for i, r in enumerate(rows) if r is not None and not rule[i] and not (i + 1 < len(rows) and rule[i + 1])]


def test_architecture_layer_table_is_LAYERS():
    """Section 3 lists each layer of LAYERS, in order, with exactly its entries."""
    rows = [(r[0], set(re.findall(r"`([^`]+)`", r[1]))) for r in table_rows(doc_section(3))]
    want = [(name.split(":")[0], set(entries)) for name, entries in LAYERS]
    assert [r[0] for r in rows] == [w[0] for w in want], f"{DOC} section 3: the layers, in order, are {want}"
    wrong = [f"{layer}: add {sorted(w - d)}, remove {sorted(d - w)}" for (layer, d), (_, w) in zip(rows, want) if d != w]
    assert not wrong, f"{DOC} section 3 differs from LAYERS in {__file__}: " + "; ".join(wrong)


def _defines(path: Path, name: str) -> bool:
    return bool(re.search(rf"^\s*(def|class)\s+{name}\b|^\s*{name}\s*[:=]", path.read_text(), re.M))


def _resolve(token: str) -> bool | None:
    """Whether a path (`steps/up.py`, `sim/`, `steps/stale.FIND`) or a `module.name` the doc names exists; None
    for anything else (on-node paths, flags, commands, classes)."""
    bases = (REPO, PACKAGE, REPO / "overlays", REPO / "overlays" / "spark_overlays")
    if "/" in token:
        if token.startswith("/") or not any((b / token.split("/")[0]).is_dir() for b in bases[:2]):
            return None  # an on-node path (`/etc/...`, `releases/NNNN/`)
        if any((b / token).exists() or (b / f"{token}.py").is_file() for b in bases):
            return True
        mod, _, attr = token.rpartition("/")[2].partition(".")
        where = token.rpartition("/")[0]
        return bool(attr) and any((b / where / f"{mod}.py").is_file() and _defines(b / where / f"{mod}.py", attr)
                                  for b in bases)
    if re.fullmatch(r"\w+\.py", token):  # a module in any folder of the package, or of the overlays
        return any((b / token).is_file() for b in bases) or any(PACKAGE.rglob(token))
    m = re.fullmatch(r"(\w+)\.(\w+)(\(.*\))?", token)
    if not m or m.group(2) in ("json", "sh", "env", "txt", "yml", "yaml", "md", "service", "timer"):
        return None
    mod, attr = m.group(1), m.group(2)
    if mod == "sparkdeploy":
        return (PACKAGE / f"{attr}.py").is_file() or (PACKAGE / attr).is_dir()
    if any((d / f"{attr}.py").is_file() for d in [PACKAGE / mod, *PACKAGE.rglob(mod)]):
        return True  # a module in a folder: `bench.stats`
    files = [f for f in [*PACKAGE.rglob(f"{mod}.py"), PACKAGE / mod / "__init__.py", bases[3] / f"{mod}.py",
                         bases[2] / mod / "__init__.py"] if f.is_file()]
    return None if not files else any(_defines(f, attr) for f in files)


def test_architecture_names_only_what_exists():
    """Every repo path and every `module.name` ARCHITECTURE.md names is there (fenced blocks aside)."""
    text = re.sub(r"^```.*?^```", "", DOC.read_text(), flags=re.M | re.S)
    missing = sorted({t for t in re.findall(r"`([^`\n]+)`", text) if _resolve(t) is False})
    assert not missing, f"{DOC} names what the code does not have (fix the doc): {missing}"


def test_architecture_up_order_is_the_code_order():
    """Section 1's table follows `steps/up._up`: the calls it names come in _up's order, and every `step_*`
    that _up runs is there."""
    from sparkdeploy.steps import up

    fn = next(n for n in ast.walk(ast.parse(Path(up.__file__).read_text())) if getattr(n, "name", "") == "_up")
    called = sorted((c.lineno, c.col_offset, c.func.attr if isinstance(c.func, ast.Attribute) else c.func.id)
                    for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, (ast.Attribute, ast.Name)))
    first: dict[str, int] = {}
    for i, (_, _, name) in enumerate(called):
        first.setdefault(name, i)
    named = []
    for row in table_rows(doc_section(1)):
        words = [re.findall(r"\w+", t)[-1] for t in re.findall(r"`([^`]+)`", row[1]) if re.findall(r"\w+", t)]
        hit = next((w for w in words if w in first), None)
        if hit:
            named.append(hit)
    assert named == sorted(named, key=first.get), f"{DOC} section 1 orders the steps {named}; _up runs them in " \
        f"the order {sorted(named, key=first.get)}"
    steps = [n for n in first if n.startswith("step_")]
    assert set(steps) <= set(named), f"{DOC} section 1 lacks {sorted(set(steps) - set(named))}, which _up runs"


def test_the_package_top_holds_at_most_ten_modules():
    """Modules belong in the folder of their layer; the top keeps only the small helpers every layer uses."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 10, f"{len(top)} modules at {PACKAGE}: move some into their layer's folder: {top}"
