"""What a vocab rollout checks and compares, apart from the procedure (`steps/vocab_rollout/__init__.py`): the
candidate list validated against the served tokenizer, the list diff and coverage change, the golden temperature-0
outputs (and acceptance per category) captured before and after, the version a `vocab rollback` picks, a list
written with its manifest, and the derived release's files. The ranks are watched by `steps/engine.rank_watch`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sparkdeploy.bench import metrics as M
from sparkdeploy.bench import prompts as bench_prompts
from sparkdeploy.errors import SparkdeployError, VocabError
from sparkdeploy.ops import health, releases, vocab_live
from sparkdeploy.plan import render
from sparkdeploy.vocab.formats import list_bytes, parse_list


class RolloutError(SparkdeployError):
    """The rollout could not start or complete (the message says which step and node)."""


class Failed(SparkdeployError):
    """A failure after the switch: roll back."""


# ------------------------------------------------------------------------------------- local validation
@dataclass
class Candidate:
    """A list that passed validation against the served tokenizer."""

    path: str
    data: bytes
    ids: np.ndarray
    sha256: str
    tokenizer_hash: str
    manifest: dict | None

    @property
    def version(self) -> str:
        return self.sha256[:12]

    @property
    def size(self) -> int:
        return int(self.ids.size)

    def meta(self) -> dict:
        m = self.manifest or {}
        return {"source": Path(self.path).name, "size": self.size, "tokenizer": self.tokenizer_hash,
                "name": m.get("name"), "manifest": bool(self.manifest)}


def check_candidate(path: str, tokenizer, *, allow_no_manifest: bool = False) -> Candidate:
    """Validate a list file against the served tokenizer; VocabError (exit 2) says why it is refused.

    Only plain id lists travel (the engine reads one id per line): `.npy` and EAGLE-3 offset files are
    converted by `sparkdeploy vocab build/merge -o x.txt` first.
    """
    from sparkdeploy.vocab import find_manifest, validate_list

    p = Path(path)
    data = list_bytes(p)
    ids = parse_list(data, str(p), tokenizer.vocab_size)
    manifest = find_manifest(p)
    if manifest is None and not allow_no_manifest:
        raise VocabError(f"{path}: no manifest names the tokenizer this list was built for, so its tokenizer hash "
                         "cannot be checked; build it with `sparkdeploy vocab build/merge` (which write one) or "
                         "pass --allow-no-manifest")
    ids = validate_list(ids, tokenizer, manifest, what=str(p))
    return Candidate(str(p), data, ids, hashlib.sha256(data).hexdigest(), tokenizer.content_hash, manifest)


def list_diff(old: np.ndarray | None, new: np.ndarray, examples: int = 8) -> dict:
    """Ids added and removed going from `old` to `new` (old None: unknown)."""
    if old is None:
        return {"old_size": None, "new_size": int(new.size), "added": None, "removed": None}
    added, removed = np.setdiff1d(new, old), np.setdiff1d(old, new)
    return {"old_size": int(old.size), "new_size": int(new.size), "added": int(added.size),
            "removed": int(removed.size), "added_examples": added[:examples].tolist(),
            "removed_examples": removed[:examples].tolist()}


def coverage_change(old: np.ndarray | None, new: np.ndarray, tokenizer, samples: list[str]) -> list[dict]:
    """Per sample text file: share of its tokens off the old and the new list."""
    from sparkdeploy.vocab import coverage

    rows = []
    for s in samples:
        try:
            text = Path(s).read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            raise VocabError(f"--samples {s}: {err.strerror or err}") from None
        after = coverage(new, tokenizer, [text])
        row = {"text": s, "tokens": int(after.tokens), "miss_new": after.miss_rate, "miss_old": None}
        if old is not None:
            row["miss_old"] = coverage(old, tokenizer, [text]).miss_rate
        rows.append(row)
    return rows


# -------------------------------------------------------------------------------------------- golden
@dataclass
class Golden:
    outputs: dict[str, str] = field(default_factory=dict)  # "category#i" -> text
    acceptance: dict[str, dict | None] = field(default_factory=dict)  # category -> spec-decode figures
    notes: list[str] = field(default_factory=list)


def golden_prompts(categories: list[str] | None = None, per_category: int = 1) -> list[tuple[str, str]]:
    """(category, prompt) pairs from the bench prompt set: the same fixed text on every run."""
    cats = bench_prompts.select(bench_prompts.load(), categories or [])
    out = []
    for c in cats:
        for p in c.prompts[:per_category]:
            out.append((c.name, (c.system + "\n\n" if c.system else "") + p))
    return out


def capture(url: str, model: str, prompts: list[tuple[str, str]], *, max_tokens: int, timeout: float,
            metrics: bool = True, api_key: str | None = None) -> Golden:
    """Temperature-0 outputs, one request at a time; acceptance per category from counter deltas (kept only
    when exactly our requests finished in between)."""
    g = Golden()
    by_cat: dict[str, list[tuple[int, str]]] = {}
    for i, (cat, text) in enumerate(prompts):
        by_cat.setdefault(cat, []).append((i, text))
    for cat, items in by_cat.items():
        before = _scrape(url) if metrics else None
        for i, text in items:
            g.outputs[f"{cat}#{i}"] = health.generate(url, model, prompt=text, max_tokens=max_tokens, timeout=timeout,
                                                        api_key=api_key)
        if before is None:
            continue
        after = _scrape(url)
        try:
            d = M.Delta(before, after) if after else None
        except M.CounterReset as err:
            g.notes.append(f"{cat}: {err}")
            d = None
        if d is None:
            g.acceptance[cat] = None
            continue
        done = d(M.SUCCESS)
        if done != len(items):
            g.notes.append(f"{cat}: {done:g} requests finished while {len(items)} were sent (other traffic): "
                           "acceptance not kept")
            g.acceptance[cat] = None
        else:
            g.acceptance[cat] = d.spec_decode()
    return g


def _scrape(url: str):
    try:
        return M.scrape(url)
    except SparkdeployError:
        return None


def mismatches(golden: dict[str, str], got: dict[str, str]) -> list[str]:
    return [k for k in golden if golden[k] != got.get(k)]


def pick_version(entries: list[dict], stored: list[str], live: str | None, wanted: str | None) -> str:
    """The sha256 to roll back to: a stored version by (prefix of) its sha256, or the list live before the
    current one (the newest rollout/rollback that switched to the live list names it as `from`)."""
    if wanted:
        w = wanted.lower()
        hits = [s for s in stored if s.startswith(w)]
        if len(w) < 6 or not hits:
            raise VocabError(f"no stored version {wanted!r} (stored: {', '.join(s[:12] for s in stored) or 'none'})")
        if len(hits) > 1:
            raise VocabError(f"version {wanted!r} is ambiguous: {', '.join(s[:12] for s in hits)}")
        return hits[0]
    for e in reversed(entries):  # automatic rollbacks name the failed list as `from`: skip them
        if e.get("action") in ("rollout", "rollback") and e.get("sha256") == live and e.get("from") not in (None, live):
            return e["from"]
    raise VocabError("no earlier list in the history to roll back to; name a VERSION (`sparkdeploy vocab history`)")


def write_list_with_manifest(path: str | Path, ids, tokenizer, *, name: str | None = None, note: str = "") -> Path:
    """Write a list (one id per line) and the manifest naming its tokenizer, so a rollout can check the hash."""
    from sparkdeploy.vocab import write_list
    from sparkdeploy.vocab.formats import atomic_write_json
    from sparkdeploy.vocab.manifest import MANIFEST_FORMAT, ids_sha256, manifest_path_for

    p = Path(path)
    arr = np.unique(np.asarray(ids, dtype=np.int64))
    write_list(p, arr)
    atomic_write_json(manifest_path_for(p), {
        "format": MANIFEST_FORMAT, "name": name or p.stem, "file": p.name, "size": int(arr.size),
        "ids_sha256": ids_sha256(arr), "parts": {"note": note} if note else {},
        "tokenizer": {"name": tokenizer.name, "content_hash": tokenizer.content_hash,
                      "vocab_size": int(tokenizer.vocab_size)}})
    return p


# --------------------------------------------------------------------------- the derived release, the ranks
def derive_release(cx, node: str, prev: int, old_sha: str, cand: Candidate, action: str,
                   edit=None) -> tuple[dict[str, tuple[bytes, int]], dict]:
    """Release `prev`'s files on `node` with only the list's sha256 changed (old_sha -> cand's; then `edit`,
    a test hook, may change them), and its meta for release.json."""
    c = cx.conn(node)
    nr = cx.rel[node]
    names = releases.file_digests(c, cx.lay, prev)
    files: dict[str, tuple[bytes, int]] = {}
    hits = 0
    for name in sorted(names):
        data = c.get(f"{releases.rdir(cx.lay, prev)}/{name}")
        if data is None:
            raise RolloutError(f"release {prev} lost {name}", )
        hits += data.count(old_sha.encode())
        files[name] = (data.replace(old_sha.encode(), cand.sha256.encode()), render.file_mode(name))
    if hits == 0:
        raise RolloutError(f"release {prev} on {node} never names list {old_sha[:12]}; refusing to guess")
    if edit:
        files = {k: (v, render.file_mode(k)) for k, v in
                 edit(node, {k: v for k, (v, _) in files.items()}).items()}
    meta = {k: v for k, v in nr.complete[prev].items() if k not in ("number", "files", "written_at")}
    meta.update(fingerprint=f"{meta.get('fingerprint', '?')}+vocab-{cand.version}",
                reason=f"vocab {action} {vocab_live.version_of(old_sha)} -> {cand.version}",
                derived_from=prev, vocab={"sha256": cand.sha256, "version": cand.version,
                                                **cand.meta()})
    return files, meta
