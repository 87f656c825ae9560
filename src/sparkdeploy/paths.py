"""Where the kit's data files live: templates (images/, deploy/, systemd/), profiles, vocabs and overlays/.

In a checkout (the editable dev install, the tests) they are the checkout's own top-level directories, found by
walking up from this file to the directory holding `pyproject.toml` and `deploy/`. An installed wheel carries
copies of them as package data in `sparkdeploy/_data/` (setup.py copies them at build time), with the same
layout, so every caller joins the same relative names onto `repo_root()` either way. `SPARKDEPLOY_ROOT`
overrides both (tests, odd installs).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

# Present only in an installed wheel: the source tree never has it (setup.py writes it into the build dir).
INSTALLED_DATA = Path(__file__).parent / "_data"


@lru_cache(maxsize=None)
def _find_root(start: str) -> Path:
    here = Path(start).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pyproject.toml").is_file() and (candidate / "deploy").is_dir():
            return candidate
    raise FileNotFoundError(f"no sparkdeploy checkout above {start} and no installed data in {INSTALLED_DATA} "
                            "(reinstall sparkdeploy, or set SPARKDEPLOY_ROOT)")


def repo_root() -> Path:
    """The data root: `$SPARKDEPLOY_ROOT` if set, else the installed wheel's `_data/`, else the checkout root.

    The installed data wins over a checkout found above it, so a wheel installed into a venv that happens to
    sit inside some checkout still uses its own files.
    """
    env = os.environ.get("SPARKDEPLOY_ROOT")
    if env:
        return Path(env).resolve()
    if INSTALLED_DATA.is_dir():
        return INSTALLED_DATA
    return _find_root(str(Path(__file__).parent))


def profiles_dir() -> Path:
    return repo_root() / "deploy" / "profiles"


def templates_root() -> Path:
    """Root for jinja2 template names such as `images/serving.Dockerfile.j2` or `systemd/engine.service.j2`."""
    return repo_root()


def overlays_dir() -> Path:
    return repo_root() / "overlays"


def vocabs_dir() -> Path:
    return repo_root() / "vocabs"


def default_inventory() -> Path:
    """The checkout's inventory.yaml; for an installed wheel, ./inventory.yaml in the working directory."""
    root = repo_root()
    return Path.cwd() / "inventory.yaml" if root == INSTALLED_DATA else root / "inventory.yaml"


def state_dir() -> Path:
    """Local state (sim clusters' keys and inventories): `<checkout>/.sparkdeploy`, or for an installed tool
    `$XDG_STATE_HOME/sparkdeploy` (default ~/.local/state/sparkdeploy), never inside site-packages."""
    root = repo_root()
    if root != INSTALLED_DATA:
        return root / ".sparkdeploy"
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "sparkdeploy"


def cache_dir() -> Path:
    """Host-side cache (debootstrap packages, wheels, build logs): $SPARKDEPLOY_CACHE or ~/.cache/sparkdeploy."""
    env = os.environ.get("SPARKDEPLOY_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparkdeploy"
    base.mkdir(parents=True, exist_ok=True)
    return base


def git_commit(root: Path | None = None) -> str:
    """The checkout's HEAD commit read from .git without running git; 'unknown' when it cannot be read."""
    git = (root or repo_root()) / ".git"
    try:
        if git.is_file():  # worktree: "gitdir: <path>"
            git = Path(git.read_text().split(":", 1)[1].strip())
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        ref_file = git / ref
        if ref_file.is_file():
            return ref_file.read_text().strip()
        common = git
        if (git / "commondir").is_file():
            common = (git / (git / "commondir").read_text().strip()).resolve()
            if (common / ref).is_file():
                return (common / ref).read_text().strip()
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split(" ", 1)[0]
    except (OSError, IndexError):
        pass
    return "unknown"


def tree_digest(root: Path) -> str | None:
    """sha256 (16 hex) over (relative path, content) of every file under root; None if root is missing.

    Skips what never enters an image build context: tests/, dot-entries, __pycache__, *.pyc, *.egg-info.
    Used as the overlays package identity in the serving image tag.
    """
    if not root.is_dir():
        return None
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if (not path.is_file() or rel.parts[0] == "tests" or any(p.startswith(".") for p in rel.parts)
                or "__pycache__" in rel.parts or path.suffix == ".pyc" or any(p.endswith(".egg-info") for p in rel.parts)):
            continue
        digest.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
