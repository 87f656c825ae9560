"""`sparkdeploy vocab ...`: build, merge, learn, measure, inspect, validate and split draft vocabularies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import numpy as np

from sparkdeploy.cli.options import inventory_option
from sparkdeploy.errors import ExtraMissing, VocabError


def _console():
    from rich.console import Console

    return Console(stderr=True)


def _load(spec: str):
    from sparkdeploy.vocab import load_tokenizer

    return load_tokenizer(spec)


def _read(list_arg: str):
    """(path, ids, manifest or None) for a list path or a shipped list name."""
    from sparkdeploy.vocab import find_manifest, read_list, resolve_list

    path = resolve_list(list_arg)
    return path, read_list(path), find_manifest(path)


def _tokenizer_for(manifest: dict | None, spec: str | None, path: Path):
    if spec:
        return _load(spec)
    if manifest and manifest.get("tokenizer", {}).get("name"):
        return _load(manifest["tokenizer"]["name"])
    raise VocabError(f"{path}: no manifest names its tokenizer; pass --tokenizer")


def _key_values(values: tuple[str, ...], option: str, convert, expected: str) -> dict:
    """`KEY=VALUE` options into a dict; VocabError naming the option and the expected form."""
    out = {}
    for v in values:
        key, _, value = v.partition("=")
        try:
            out[key] = convert(value)
        except ValueError:
            raise VocabError(f"{option} {v!r}: expected {expected}") from None
    return out


def _emit(obj: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=2, ensure_ascii=False))
    else:
        for line in lines:
            click.echo(line)


@click.group("vocab")
def vocab() -> None:
    """Draft vocabularies (token-id shortlists) for the MTP draft head."""


@vocab.command("build")
@click.argument("corpus", nargs=-1, required=True)
@click.option("--tokenizer", "-t", "spec", required=True, help="qwen3.5, qwen3, a tokenizer.json or a model dir")
@click.option("--size", "-n", type=int, help="number of ids on the list")
@click.option("--coverage", "target", type=float, help="stop adding once this share of corpus tokens is covered")
@click.option("--cutoff", type=int, default=0, show_default=True, help="also take every id below this")
@click.option("--reserve", multiple=True, help="han1=K (common single Han chars) or word=K (English words)")
@click.option("--weight", multiple=True, help="NAME=W: weight of a NAME=PATH group (default 1 each)")
@click.option("--include", multiple=True, help="glob for files found in directories, e.g. '*.py'")
@click.option("--jsonl/--no-jsonl", default=None, help="read files as JSON lines (default: *.jsonl only)")
@click.option("--text-field", default="text", show_default=True, help="JSONL field holding text")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="list file (.txt/.npy/.d2t.npy)")
@click.option("--name", help="list name in its manifest (default: file stem)")
@click.option("--json", "as_json", is_flag=True, help="print the manifest as JSON")
def build(corpus, spec, size, target, cutoff, reserve, weight, include, jsonl, text_field, out, name,
          as_json) -> None:
    """Count CORPUS (files, dirs, -, NAME=PATH groups weighted equally) and write a list + manifest."""
    from sparkdeploy.vocab.build import build_list, count_corpus, parse_group

    tok = _load(spec)
    grouped: dict[str, list[str]] = {}
    for arg in corpus:
        g, p = parse_group(arg)
        grouped.setdefault(g, []).append(p)
    # options are checked before the (long) counting
    reserves = _key_values(reserve, "--reserve", int, "KIND=COUNT, e.g. han1=6000")
    weights = _key_values(weight, "--weight", float, "NAME=NUMBER, e.g. code=2")
    for g in weights:
        if g not in grouped:
            raise VocabError(f"--weight {g}={weights[g]:g}: no corpus group {g!r} (groups: {', '.join(grouped)})")
    counted = {}
    console = _console()
    for g, paths in grouped.items():
        with console.status(f"counting {g}") as status:
            def progress(chunks: int, tokens: int, g=g) -> None:
                status.update(f"counting {g}: {tokens:,} tokens")
            counted[g] = count_corpus(tok, paths, include=include, jsonl=jsonl, text_field=text_field,
                                      progress=progress)
    manifest = build_list(tok, counted, out, size=size, coverage=target, cutoff=cutoff, reserve=reserves,
                          weights=weights or None, name=name)
    lines = [f"{out}: {manifest['size']} ids for {tok.name} ({tok.content_hash[:19]})",
             "parts: " + ", ".join(f"{k} {v}" for k, v in manifest["parts"].items())]
    for g, info in manifest["build"]["groups"].items():
        cov = manifest["build"]["coverage"].get(g, 0.0)
        line = f"{g}: {info['tokens']:,} tokens, {info['bytes']:,} bytes, coverage {cov:.2%}"
        if info["invalid_utf8_bytes"]:
            line += f", {info['invalid_utf8_bytes']:,} non-UTF-8 bytes replaced"
        lines.append(line)
    _emit(manifest, as_json, lines)


@vocab.command("merge")
@click.argument("lists", nargs=-1, required=True)
@click.option("--out", "-o", type=click.Path(dir_okay=False), help="write the union here (+ manifest)")
@click.option("--tokenizer", "-t", "spec", help="validate against this tokenizer (default: from manifests)")
@click.option("--json", "as_json", is_flag=True)
def merge(lists, out, spec, as_json) -> None:
    """Union of LISTS; prints sizes, ids new from each later list, and the total (seed: 47149 9749 5606 52755)."""
    from sparkdeploy.vocab import merge_lists, validate_list, write_list
    from sparkdeploy.vocab.manifest import MANIFEST_FORMAT, ids_sha256, write_manifest

    loaded = [_read(x) for x in lists]
    hashes = {m["tokenizer"]["content_hash"] for _, _, m in loaded if m}
    if len(hashes) > 1:
        raise VocabError("lists were built for different tokenizers: " + ", ".join(sorted(hashes)))
    result = merge_lists([ids for _, ids, _ in loaded])
    tok = None
    if spec or any(m for _, _, m in loaded):
        tok = _tokenizer_for(next((m for _, _, m in loaded if m), None), spec, loaded[0][0])
        if hashes and tok.content_hash not in hashes:
            raise VocabError(f"tokenizer hash mismatch: lists were built for {hashes.pop()}, "
                             f"{tok.name} is {tok.content_hash}")
        validate_list(result.ids, tok, what="merged list")
    if out:
        write_list(out, result.ids)
        if tok is not None:
            write_manifest(out, {"format": MANIFEST_FORMAT, "name": Path(out).stem, "file": Path(out).name,
                                 "size": int(len(result.ids)), "ids_sha256": ids_sha256(result.ids),
                                 "tokenizer": {"name": tok.name, "content_hash": tok.content_hash,
                                               "vocab_size": tok.vocab_size},
                                 "parts": {"merged_from": [str(p) for p, _, _ in loaded], "sizes": result.sizes,
                                           "new": result.new}})
    obj = {"sizes": result.sizes, "new": result.new, "total": int(len(result.ids)), "out": out}
    _emit(obj, as_json, [result.line()])


@vocab.command("learn")
@click.argument("counts", nargs=-1)
@click.option("--vocab", "-l", "list_arg",
              help="the current list (file or shipped name): every id is kept (default with no COUNTS: the live "
                   "list on the head)")
@click.option("--out", "-o", type=click.Path(dir_okay=False), help="the new list (.txt/.npy/.d2t.npy) + manifest")
@click.option("--tokenizer", "-t", "spec",
              help="default: the one named in the current list's manifest (the served model's, for the live list)")
@click.option("--size", "-n", type=int, help="ids on the new list")
@click.option("--coverage", "target", type=float, help="stop adding once this share of captured tokens is covered")
@click.option("--min-count", type=int, default=1, show_default=True, help="add only ids captured this often")
@click.option("--save-counts", type=click.Path(file_okay=False), help="with no COUNTS: keep the pulled files here")
@inventory_option("inventory", help="with no COUNTS: pull the counts from this inventory's nodes "
                                    "(default: inventory.yaml of the checkout)")
@click.option("--trust-new-hosts", is_flag=True, help="accept and record SSH host keys not seen before")
@click.option("--dry-run", is_flag=True, help="report what the list would be; write nothing")
@click.option("--json", "as_json", is_flag=True)
def learn_cmd(counts, list_arg, out, spec, size, target, min_count, save_counts, inventory, trust_new_hosts,
              dry_run, as_json) -> None:
    """Add the ids the engine emitted most to the current list; the new list goes to `vocab rollout`.

    COUNTS: `.npy` files of `spark_overlays.capture`; none: pulled from the nodes (`vocab capture on` gathers
    them). Prints the miss rate of the captured traffic before and after."""
    from sparkdeploy.vocab import validate_list, write_list
    from sparkdeploy.vocab.formats import parse_list
    from sparkdeploy.vocab.learn import learn, make_manifest, read_captured
    from sparkdeploy.vocab.manifest import write_manifest

    if not out and not dry_run:
        raise VocabError("give --out FILE for the new list (or --dry-run)")
    if counts and not list_arg:
        raise VocabError("give --vocab: the list the counts are to be added to")
    if counts:
        path, ids, manifest = _read(list_arg)
        tok = _tokenizer_for(manifest, spec, path)
    else:
        from sparkdeploy.cli.options import connected
        from sparkdeploy.model import served_tokenizer
        from sparkdeploy.steps import capture

        with connected(inventory, trust_new_hosts) as cx:
            counts = capture.pull(cx, save_counts)
            live = None if list_arg else capture.live_list(cx)
            inv = cx.inv
        if list_arg:
            path, ids, manifest = _read(list_arg)
            tok = _tokenizer_for(manifest, spec, path)
        else:
            tok = _load(spec) if spec else served_tokenizer.resolve(inv)
            path, ids, manifest = live[0], parse_list(live[1], live[0], tok.vocab_size), None
    if manifest and manifest.get("tokenizer", {}).get("content_hash") != tok.content_hash:
        raise VocabError(f"{path}: built for tokenizer {manifest['tokenizer'].get('content_hash')}, "
                         f"{tok.name} is {tok.content_hash}")
    captured = read_captured(counts, tok)
    res = learn(ids, captured, tok, size=size, coverage=target, min_count=min_count)
    validate_list(res.ids, tok, what="learned list")
    if out and not dry_run:
        write_list(out, res.ids)
        write_manifest(out, make_manifest(out, res, captured, tok, current=str(path),
                                          settings={"size": size, "coverage": target, "min_count": min_count}))
    obj = {"list": str(path), "out": out, "dry_run": dry_run, "tokens": captured.tokens,
           "outside_tokenizer": captured.outside, "counts": captured.files, "size_before": int(len(ids)),
           "size": int(len(res.ids)), "parts": res.parts,
           "miss_rate": {"before": round(res.before.miss_rate, 6), "after": round(res.after.miss_rate, 6)},
           "by_class": res.by_class, "top_added": [{"id": i, "count": c, "text": t} for i, c, t in res.top_added]}
    lines = [f"captured: {captured.tokens:,} tokens in {len(captured.files)} counts file(s)"
             + (f" (+{captured.outside:,} with ids outside the tokenizer, never listed)" if captured.outside else ""),
             f"miss rate on the captured traffic: {res.before.miss_rate:.2%} -> {res.after.miss_rate:.2%}",
             f"list: {len(ids)} -> {len(res.ids)} ids (+{res.parts['learned']} learned, +{res.parts['core']} "
             "structural core; every current id kept)",
             "by class: " + ", ".join(f"{c} {v['miss_before']:.1%} -> {v['miss_after']:.1%}"
                                      for c, v in res.by_class.items())]
    if res.top_added:
        lines.append("most frequent added: " + " ".join(repr(t) for _, _, t in res.top_added))
    lines.append("dry run: nothing written" if dry_run
                 else f"wrote {out} (+ manifest); next: sparkdeploy vocab rollout {out}")
    _emit(obj, as_json, lines)


@vocab.command("coverage")
@click.option("--vocab", "-l", "list_arg", required=True, help="list file or shipped list name (or 'default')")
@click.argument("texts", nargs=-1, required=True)
@click.option("--tokenizer", "-t", "spec", help="default: the one named in the list's manifest")
@click.option("--top", type=int, default=10, show_default=True, help="most frequent missed tokens to show")
@click.option("--include", multiple=True, help="glob for files found in directories")
@click.option("--json", "as_json", is_flag=True)
def coverage_cmd(list_arg, texts, spec, top, include, as_json) -> None:
    """Per TEXT file (or NAME=PATH group): tokens, off-list tokens, miss rate, top missed tokens."""
    from sparkdeploy.vocab import coverage_from_counts, validate_list
    from sparkdeploy.vocab.build import count_corpus, parse_group

    path, ids, manifest = _read(list_arg)
    tok = _tokenizer_for(manifest, spec, path)
    ids = validate_list(ids, tok, manifest, what=str(path))
    rows, lines = [], [f"{'text':40} {'tokens':>12} {'off-list':>10} {'miss':>7}  top missed"]
    for arg in texts:
        label, p = parse_group(arg)
        label = p if label == "corpus" else label
        counted = count_corpus(tok, [p], include=include)
        res = coverage_from_counts(ids, counted.counts, tok, top)
        row = {"text": label, **res.to_dict(), "invalid_utf8_bytes": counted.stats.invalid_utf8_bytes}
        rows.append(row)
        missed = " ".join(repr(t) for _, _, t in res.top_missed[:top])
        lines.append(f"{label[-40:]:40} {res.tokens:>12,} {res.off_list:>10,} {res.miss_rate:>7.2%}  {missed}")
        if counted.stats.invalid_utf8_bytes:
            lines.append(f"{'':40} ({counted.stats.invalid_utf8_bytes:,} non-UTF-8 bytes replaced)")
    _emit({"list": str(path), "size": int(len(ids)), "tokenizer": tok.content_hash, "texts": rows}, as_json, lines)


@vocab.command("inspect")
@click.argument("list_arg")
@click.option("--tokenizer", "-t", "spec")
@click.option("--json", "as_json", is_flag=True)
def inspect(list_arg, spec, as_json) -> None:
    """Size, parts, by-script histogram and id range of a list."""
    from sparkdeploy.vocab.classify import class_histogram

    path, ids, manifest = _read(list_arg)
    obj = {"list": str(path), "size": int(len(ids)), "min": int(ids.min()) if len(ids) else None,
           "max": int(ids.max()) if len(ids) else None, "manifest": bool(manifest)}
    if manifest:
        obj.update(parts=manifest.get("parts"), tokenizer=manifest.get("tokenizer"),
                   heldout=manifest.get("heldout"), independent=manifest.get("independent"))
    tok = None
    try:
        tok = _tokenizer_for(manifest, spec, path)
    except (VocabError, ExtraMissing):  # the histogram only: the rest needs no tokenizer (nor the vocab extra)
        if spec:
            raise
    if tok is not None:
        inrange = ids[(ids >= 0) & (ids < tok.vocab_size)]
        obj["by_class"] = class_histogram(inrange, tok)
    lines = [f"{path}: {obj['size']} ids, range {obj['min']}..{obj['max']}"]
    if manifest:
        lines.append(f"tokenizer: {manifest['tokenizer'].get('name')} {manifest['tokenizer'].get('content_hash')}")
        lines.append("parts: " + json.dumps(manifest.get("parts"), ensure_ascii=False))
    if "by_class" in obj:
        lines.append("by class: " + ", ".join(f"{k} {v}" for k, v in obj["by_class"].items()))
    for key in ("heldout", "independent"):
        if manifest and manifest.get(key):
            lines.append(f"{key} miss rate: " + ", ".join(f"{g} {r:.2%}" for g, r in manifest[key].items()))
    _emit(obj, as_json, lines)


@vocab.command("validate")
@click.argument("list_arg")
@click.option("--tokenizer", "-t", "spec", help="validate against this tokenizer (e.g. the served model dir)")
@click.option("--json", "as_json", is_flag=True)
def validate(list_arg, spec, as_json) -> None:
    """Ids in range, sorted, unique, EOS/control tokens present, manifest hash matches the tokenizer."""
    from sparkdeploy.vocab import validate_list

    path, ids, manifest = _read(list_arg)
    tok = _tokenizer_for(manifest, spec, path)
    validate_list(ids, tok, manifest, what=str(path))
    _emit({"list": str(path), "ok": True, "size": int(len(ids)), "tokenizer": tok.content_hash,
           "manifest": bool(manifest)}, as_json,
          [f"{path}: ok, {len(ids)} ids valid for {tok.name} ({tok.content_hash[:19]})"
           + ("" if manifest else " (no manifest: hash not checked)")])


@vocab.command("split")
@click.argument("list_arg")
@click.option("--tp", type=int, required=True, help="tensor-parallel ranks")
@click.option("--pad-to", type=int, default=64, show_default=True, help="row padding of the vocab-parallel head")
@click.option("--out-dir", type=click.Path(file_okay=False), help="write rank<R>.txt shards here")
@click.option("--json", "as_json", is_flag=True)
def split(list_arg, tp, pad_to, out_dir, as_json) -> None:
    """Even contiguous split per TP rank, as vLLM's vocab-parallel layer shards the overlay's draft head."""
    from sparkdeploy.vocab import split_for_tp, write_list

    path, ids, _ = _read(list_arg)
    res = split_for_tp(np.sort(ids), tp, pad_to)
    if out_dir:
        for r, shard in enumerate(res.shards):
            write_list(Path(out_dir) / f"rank{r}.txt", shard)
    obj = {"list": str(path), **res.to_dict()}
    _emit(obj, as_json, [f"{path}: {len(ids)} ids, tp {tp}, {res.rows_per_rank} rows per rank"]
          + [f"rank {r['rank']}: {r['ids']} ids ({r['first']}..{r['last']}), {r['padding']} padding"
             for r in obj["ranks"]])


COMMANDS = [vocab]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(vocab())
