"""The served model's tokenizer, known on this machine: a rollout validates a list against it before it
opens any connection to a node.

`deploy/tokenizers.yaml` maps a profile's model id to a tokenizer source and its recorded content hash.
A source `image:DIR` is read from the profile's image base in this machine's Docker (a throwaway
`docker create` + `docker cp`, cached by image ID); anything else is a `load_tokenizer` spec. The tokenizer
loaded must hash to the recorded value: a list built for another vocabulary is refused, and so is a
tokenizer that drifted from the one the nodes serve.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import yaml

from sparkdeploy import paths
from sparkdeploy.errors import VocabError

TABLE = "deploy/tokenizers.yaml"
_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")


def table(root: Path | None = None) -> dict[str, dict]:
    path = (root or paths.repo_root()) / TABLE
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise VocabError(f"{path}: cannot read the served-tokenizer table: {err}") from err
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise VocabError(f"{path}: models: expected a mapping of model id -> {{source, content_hash}}")
    return {str(k): dict(v or {}) for k, v in models.items()}


def known_vocab_size(model_id: str) -> int | None:
    """The served tokenizer's vocabulary size recorded in the table, without loading it (None: not recorded)."""
    try:
        size = table().get(model_id, {}).get("vocab_size")
    except VocabError:
        return None
    return size if isinstance(size, int) and size > 0 else None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkdeploy" / "tokenizers"


def from_image(image: str, directory: str) -> Path:
    """Copy the tokenizer files of `directory` out of a local image (cached by image ID); return the copy."""
    def docker(*argv: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise VocabError(f"reading the served tokenizer from image {image}: docker: {err}") from err

    res = docker("image", "inspect", "-f", "{{.Id}}", image)
    if res.returncode != 0:
        raise VocabError(f"the served tokenizer lives in image {image}, which is not on this machine "
                         f"({res.stderr.strip()[:200]}); build it (sparkdeploy sim up) or pass --tokenizer")
    image_id = res.stdout.strip().split(":")[-1][:16]
    out = cache_dir() / image_id / directory.strip("/").replace("/", "_")
    if (out / "tokenizer.json").is_file():
        return out
    name = f"sparkdeploy-tok-{uuid.uuid4().hex[:8]}"
    res = docker("create", "--name", name, image, "true")
    if res.returncode != 0:
        raise VocabError(f"docker create {image}: {res.stderr.strip()[:200]}")
    try:
        tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        for f in _FILES:
            got = docker("cp", f"{name}:{directory.rstrip('/')}/{f}", str(tmp / f))
            if got.returncode != 0 and f == "tokenizer.json":
                raise VocabError(f"image {image} has no {directory}/tokenizer.json: {got.stderr.strip()[:200]}")
        if not out.exists():
            tmp.replace(out)
    finally:
        docker("rm", "-f", name)
    return out


def resolve(inventory, spec: str | None = None):
    """The Tokenizer the inventory's model serves (checked against the recorded hash when one is recorded)."""
    from sparkdeploy.vocab import load_tokenizer

    model = inventory.profile.model_id
    entry = table().get(model, {})
    source = spec or entry.get("source")
    if not source:
        raise VocabError(f"no tokenizer is recorded for model {model!r} in {TABLE}; add it there or pass --tokenizer")
    where = str(from_image(inventory.image.base, source[len("image:"):])) if source.startswith("image:") else source
    tok = load_tokenizer(where)
    want = entry.get("content_hash")
    if want and tok.content_hash != want:
        raise VocabError(f"tokenizer {source!r} hashes to {tok.content_hash}, but {TABLE} records {want} for the "
                         f"served model {model!r}: the local copy is not what the nodes serve")
    return tok
