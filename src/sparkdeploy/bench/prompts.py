"""The prompt sets: a YAML of categories, each a list of user messages (and an optional system message)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from sparkdeploy.errors import InputError

DEFAULT = Path(__file__).with_name("prompts.yaml")
# the categories of DEFAULT the speed sentinel measures unless the inventory's `sentinel.categories` says otherwise
SENTINEL_CATEGORIES = ("code", "prose_en", "prose_zh_hant", "prose_zh_hans", "reasoning")


@dataclass(frozen=True)
class Category:
    name: str
    prompts: tuple[str, ...]
    system: str | None = None
    description: str = ""

    def messages(self, i: int) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": self.prompts[i % len(self.prompts)]}]


def load(path: str | Path | None = None) -> dict[str, Category]:
    """Load a prompt set; errors name the file and the field."""
    path = Path(path) if path else DEFAULT
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise InputError(f"{path}: cannot read prompt set: {err}") from err
    cats = data.get("categories") if isinstance(data, dict) else None
    if not isinstance(cats, dict) or not cats:
        raise InputError(f"{path}: categories: expected a mapping of category name -> prompts")
    out: dict[str, Category] = {}
    for name, body in cats.items():
        if isinstance(body, list):
            body = {"prompts": body}
        prompts = body.get("prompts") if isinstance(body, dict) else None
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise InputError(f"{path}: categories.{name}.prompts: expected a non-empty list of strings")
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            raise InputError(f"{path}: categories.{name}.system: expected a string")
        out[str(name)] = Category(str(name), tuple(prompts), system, str(body.get("description", "")))
    return out


def select(categories: dict[str, Category], wanted: list[str] | tuple[str, ...]) -> list[Category]:
    """Categories by name or name prefix (`prose_zh` selects both Chinese sets); all when none is given."""
    if not wanted:
        return list(categories.values())
    chosen: list[Category] = []
    for w in wanted:
        matches = [c for n, c in categories.items() if n == w] or \
                  [c for n, c in categories.items() if n.startswith(w)]
        if not matches:
            raise InputError(f"--category {w}: no such category (have: {', '.join(categories)})")
        chosen += [c for c in matches if c not in chosen]
    return chosen
