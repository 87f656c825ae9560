"""On-node names are defined once, in `sparkdeploy.node.layout`; the watchdog runs on the node with the standard
library only and keeps its own copy of the one path it needs, so it is checked here."""

import ast
import re
from pathlib import Path

import sparkdeploy
from sparkdeploy.node import layout

PACKAGE = Path(sparkdeploy.__file__).parent


def test_the_watchdog_state_path_is_the_layouts():
    tree = ast.parse((PACKAGE / "node" / "scripts" / "watchdog.py").read_text())
    state = next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", "") == "STATE" for t in n.targets))
    assert state == layout.PLAIN.watchdog_state


def test_no_module_spells_an_on_node_path_of_its_own():
    """A literal /etc/sparkdeploy, /var/lib/sparkdeploy or /usr/local/lib/sparkdeploy in code (not in a
    docstring or comment, not in a shell script the module sends) belongs in layout.py."""
    literal = re.compile(r"""^[^#]*["'](/etc/sparkdeploy|/var/lib/sparkdeploy|/usr/local/lib/sparkdeploy)[/"']""")
    allowed = {PACKAGE / "node" / "layout.py", PACKAGE / "node" / "scripts" / "watchdog.py"}
    found = []
    for f in PACKAGE.rglob("*.py"):
        if f in allowed:
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if literal.search(line):
                found.append(f"{f.relative_to(PACKAGE)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
