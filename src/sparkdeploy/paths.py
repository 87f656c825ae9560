"""Where the kit's data files live: the checkout's root (templates, profiles, vocabs, overlays).

The package is installed editable from the checkout, so the root is found by walking up from this file to
the directory holding `pyproject.toml` and `deploy/`. `SPARKDEPLOY_ROOT` overrides it (tests, odd installs).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=None)
def _find_root(start: str) -> Path:
    here = Path(start).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pyproject.toml").is_file() and (candidate / "deploy").is_dir():
            return candidate
    raise FileNotFoundError(f"no sparkdeploy checkout above {start} (set SPARKDEPLOY_ROOT)")


def repo_root() -> Path:
    """The checkout root: `$SPARKDEPLOY_ROOT` if set, else the first parent with pyproject.toml and deploy/."""
    env = os.environ.get("SPARKDEPLOY_ROOT")
    if env:
        return Path(env).resolve()
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
    return repo_root() / "inventory.yaml"


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
