"""`bench report`: markdown + PNG plots from one or more results files (and a comparison when two are given
with `compare=True`). Plots: decode tok/s per category, acceptance per draft position, TTFT, turn two, and
throughput over concurrency. Bars are medians; whiskers span the kept repeats (min..max)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from sparkdeploy import extras
from sparkdeploy.bench import compare as compare_mod


@functools.cache
def _pyplot():
    """matplotlib's pyplot, drawing into files only (no display needed); matplotlib is the `bench` extra."""
    extras.require("bench", "matplotlib").use("Agg")
    return extras.require("bench", "matplotlib.pyplot")


def _label(result: dict, path: str) -> str:
    return Path(path).stem


def _groups(result: dict, name: str, exclude_prefix: tuple[str, ...] = ()) -> list[str]:
    return [m["group"] for m in result["metrics"].values()
            if m["name"] == name and not m["group"].startswith(exclude_prefix) and m["group"] != "overall"]


def _bars(ax, results: list[tuple[str, dict]], name: str, groups: list[str]) -> None:
    results = [(label, res) for label, res in results
               if any(f"{g}/{name}" in res["metrics"] for g in groups)]
    width = 0.8 / max(1, len(results))
    for j, (label, res) in enumerate(results):
        xs, ys, lo, hi = [], [], [], []
        for i, g in enumerate(groups):
            m = res["metrics"].get(f"{g}/{name}")
            if not m or m["median"] is None:
                continue
            xs.append(i + j * width - 0.4 + width / 2)
            ys.append(m["median"])
            lo.append(m["median"] - m["min"])
            hi.append(m["max"] - m["median"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=label)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20, ha="right")
    if len(results) > 1:
        ax.legend()


def _save(fig, out: Path, name: str, written: list[str]) -> None:
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    _pyplot().close(fig)
    written.append(name)


def plots(results: list[tuple[str, dict]], out: Path) -> list[str]:
    plt = _pyplot()
    written: list[str] = []
    union = lambda name, excl=(): list(dict.fromkeys(g for _, r in results for g in _groups(r, name, excl)))  # noqa: E731

    cats = union("decode_tok_s") + union("server_decode_tok_s")
    cats = [g for g in dict.fromkeys(cats) if not re.fullmatch(r"c\d+", g)]
    if cats:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
        _bars(axes[0], results, "decode_tok_s", cats)
        axes[0].set_ylabel("decode tok/s (single stream)")
        axes[0].set_title("client: streamed token timestamps")
        _bars(axes[1], results, "server_decode_tok_s", cats)
        axes[1].set_title("server: vllm:request_decode_time_seconds")
        fig.suptitle("Decode speed per category (median; whiskers min..max of kept runs)")
        _save(fig, out, "tok_s_per_category.png", written)

    pos_names = sorted({m["name"] for _, r in results for m in r["metrics"].values()
                        if m["name"].startswith("accept_pos")}, key=lambda n: int(n[len("accept_pos"):]))
    if pos_names:
        fig, ax = plt.subplots(figsize=(8, 4))
        for label, res in results:
            for g in [g for g in union(pos_names[0]) if not re.fullmatch(r"c\d+", g)]:
                ys = [res["metrics"].get(f"{g}/{n}", {}).get("median") for n in pos_names]
                if any(y is not None for y in ys):
                    ax.plot(range(len(pos_names)), [y if y is not None else float("nan") for y in ys],
                            marker="o", label=f"{label}: {g}" if len(results) > 1 else g)
        ax.set_xticks(range(len(pos_names)))
        ax.set_xticklabels([f"position {n[len('accept_pos'):]}" for n in pos_names])
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("accepted / drafts")
        ax.set_title("Draft acceptance per position")
        ax.legend(fontsize=7)
        _save(fig, out, "acceptance_per_position.png", written)

    ttft_groups = [g for g in union("ttft_s") if not re.fullmatch(r"c\d+", g)]
    if ttft_groups:
        fig, ax = plt.subplots(figsize=(8, 4))
        _bars(ax, results, "ttft_s", ttft_groups)
        ax.set_ylabel("TTFT (s)")
        ax.set_title("Time to first token per category")
        _save(fig, out, "ttft.png", written)

    t2 = union("ttft_turn2_s")
    t2_results = [(label, res) for label, res in results if res.get("kind") == "turn2"]
    if t2 and t2_results:
        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.4 / max(1, len(t2_results))
        for j, (label, res) in enumerate(t2_results):
            for k, (name, what) in enumerate((("ttft_turn1_s", "turn 1"), ("ttft_turn2_s", "turn 2"))):
                xs, ys = [], []
                for i, g in enumerate(t2):
                    m = res["metrics"].get(f"{g}/{name}")
                    if m and m["median"] is not None:
                        xs.append(i + (2 * j + k) * width - 0.4 + width / 2)
                        ys.append(m["median"])
                bars = ax.bar(xs, ys, width, label=f"{label} {what}" if len(t2_results) > 1 else what)
                if name == "ttft_turn2_s":
                    for bar, g in zip(bars, [g for g in t2 if f"{g}/{name}" in res["metrics"]]):
                        hits = res["metrics"].get(f"{g}/prefix_hits_turn2", {}).get("median")
                        if hits is not None:
                            ax.annotate(f"{hits:,.0f} hits", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                        ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(t2)))
        ax.set_xticklabels(t2)
        ax.set_ylabel("TTFT (s)")
        ax.set_title("Turn two: TTFT and prefix-cache hits")
        ax.legend()
        _save(fig, out, "turn2_ttft.png", written)

    conc = sorted({int(g[1:]) for _, r in results for g in _groups(r, "throughput_tok_s") + _groups(r, "decode_tok_s")
                   if re.fullmatch(r"c\d+", g)})
    if conc:
        fig, ax = plt.subplots(figsize=(8, 4))
        with_sweep = [(label, res) for label, res in results if any(re.fullmatch(r"c\d+", m["group"])
                                                                     for m in res["metrics"].values())]
        for label, res in with_sweep:
            ys = []
            for k in conc:
                m = res["metrics"].get(f"c{k}/throughput_tok_s") or res["metrics"].get(f"c{k}/decode_tok_s")
                ys.append(m["median"] if m else float("nan"))
            ax.plot(conc, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(conc)
        ax.set_xticklabels([str(k) for k in conc])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("total tok/s")
        ax.set_title("Throughput over concurrency")
        if len(with_sweep) > 1:
            ax.legend()
        _save(fig, out, "concurrency.png", written)
    return written


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if unit in ("tokens", "requests") or abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"
    return str(v)


HOW_TO_READ = """<details><summary>How to read this</summary>

- Every figure is the median of the kept runs after the warm-up; min/max span those runs. A run starts only
  when `vllm:num_requests_running` and `_waiting` are 0 and is kept only if `vllm:request_success_total` rose by
  exactly the requests it sent, no counter was reset (server restart) and nothing else was left running.
- `decode_tok_s`: client side, output tokens after the first over the time after the first, from streamed
  chunk timestamps; a stream whose tokens arrived in one burst is left out (its timing says nothing).
  `server_decode_tok_s`: the engine's own figure from `vllm:request_decode_time_seconds` and
  `vllm:generation_tokens_total` deltas. `ttft_s` / `server_ttft_s` likewise.
- `acceptance_length` = 1 + accepted / drafts (tokens per verify step); `accept_posN` = accepted at draft
  position N / drafts; from `vllm:spec_decode_*` counter deltas over the run.
- `throughput_tok_s` (concurrency groups `cK`): all output tokens of the K streams over the run's wall time.
- turn2: `prefix_hits_turn2` = `vllm:prefix_cache_hits_total` delta of turn two (tokens served from cache).
- Comparisons: noise = pooled standard deviation of the repeats of both sides; a difference of medians counts
  ("better"/"worse") only beyond a two-sided Student-t bound on that noise, never a fixed percentage; the
  bound is at 1% divided by the number of figures whose repeats vary, so a comparison false-alarms at most 1%.
  With extra baseline sessions (`--baseline`), the spread of the sessions' medians must be exceeded as well.
</details>
"""


def markdown(results: list[tuple[str, dict]], images: list[str], *, title: str, note: str | None,
             comparisons: list[tuple[str, str, dict]] = ()) -> str:
    lines = [f"# {title}", ""]
    if note:
        lines += [f"> {note}", ""]
    lines += [HOW_TO_READ, ""]
    for label, res in results:
        svc, ctx, st = res["service"], res.get("context") or {}, res["settings"]
        lines += [f"## {label} ({res['kind']}, {res['created']})", "",
                  f"- service: `{svc.get('url')}`, model `{svc.get('model')}`, vLLM {svc.get('vllm_version') or 'unknown'}"
                  + (f", max_model_len {svc['max_model_len']}" if svc.get("max_model_len") else "")]
        for key in ("release", "image", "vocab_hash", "patches", "release_source"):
            if key in ctx:
                lines.append(f"- {key}: `{ctx[key]}`")
        lines.append("- settings: " + ", ".join(f"{k}={v}" for k, v in st.items()))
        kept = sum(1 for r in res["runs"] if r["kept"] and not r["warmup"])
        lines += [f"- runs: {kept} kept, {len(res['discarded'])} discarded "
                  f"(warm-ups excluded from every figure)", ""]
        lines += ["| group | metric | median | min | max | n | unit |", "|---|---|---|---|---|---|---|"]
        for m in res["metrics"].values():
            if m["name"] == "peak_running" and not re.fullmatch(r"c\d+", m["group"]):
                continue
            lines.append(f"| {m['group']} | {m['name']} | {_fmt(m['median'], m['unit'])} | {_fmt(m['min'], m['unit'])} | "
                         f"{_fmt(m['max'], m['unit'])} | {m['n']} | {m['unit']} |")
        if res.get("peak_check"):
            lines += ["", "Peak running requests during the concurrency sweep:", ""]
            for g, pc in res["peak_check"].items():
                state = pc.get("state", "reached" if pc["reached"] else "not reached")
                lines.append(f"- {g}: peak {_fmt(pc['peak_running'])} of {pc['concurrency']}: {state}"
                             + {"reached": "",
                                "not reached": " (the engine never ran them all at once)",
                                "inconclusive": f" (only {pc.get('min_samples_per_run')} samples in a run: "
                                                "runs too short for the sampler)"}.get(state, ""))
        if res["discarded"]:
            lines += ["", "Discarded runs (not averaged in):", ""]
            for d in res["discarded"]:
                lines.append(f"- {d['group']} #{d['index']}{' (warm-up)' if d.get('warmup') else ''}: {d['reason']}")
        lines.append("")
    for label_a, label_b, comparison in comparisons:
        lines += [f"## Comparison: {label_b} against {label_a}", "",
                  "B against A; noise = pooled standard deviation of the repeats"
                  + (f", plus {comparison['extra_baselines']} extra baseline session(s): B must beat every "
                     "baseline session's median" if comparison["extra_baselines"] else "")
                  + f"; a difference counts only beyond the t bound on that noise at {comparison['alpha_per_figure']:.2g} "
                  "per figure (1% for the whole comparison).", ""]
        for n in comparison["comparability"]:
            lines.append(f"- not like for like: {n}")
        for side in ("a", "b"):
            only = comparison.get(f"only_in_{side}") or []
            if only:
                lines.append(f"- only in {side.upper()} (not compared): " + ", ".join(f"`{m}`" for m in only))
        sessions = any(r.get("session_noise") is not None for r in comparison["rows"])
        lines += ["", "| metric | A | B | B−A | n A/B | noise (sd) |" + (" session sd |" if sessions else "")
                  + " threshold | verdict |", "|---|---|---|---|---|---|" + ("---|" if sessions else "") + "---|---|"]
        for r in comparison["rows"]:
            lines.append(f"| {r['metric']} | {_fmt(r['a'])} | {_fmt(r['b'])} | {_fmt(r['difference'])} | "
                         f"{r['n_a']}/{r['n_b']} | {_fmt(r['noise'])} |"
                         + (f" {_fmt(r.get('session_noise'))} |" if sessions else "")
                         + f" {_fmt(r['threshold'])} | {r['verdict']} |")
        lines.append("")
    for img in images:
        lines += [f"![{img[:-4]}]({img})", ""]
    return "\n".join(lines)


def write(paths: list[str], out: str | Path, *, title: str = "sparkdeploy bench report", note: str | None = None,
          with_comparison: bool = False, pairs: list[tuple[str, ...]] = (), loaded: list[dict] | None = None) -> Path:
    """Write out/README.md and the PNGs. `pairs` (A path, B path, extra baseline paths...) add comparisons
    (loading files not listed in `paths`); `with_comparison` compares the first two files."""
    from sparkdeploy.bench import results as results_mod

    _pyplot()  # before anything is written: without the `bench` extra the command stops here, exit 2
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    loaded = loaded or [results_mod.load(p) for p in paths]
    pairs_arg = pairs
    labelled = [(_label(r, p), r) for r, p in zip(loaded, paths)]
    images = plots(labelled, out)
    wanted = list(pairs_arg)
    if with_comparison and len(paths) >= 2:
        wanted.insert(0, (paths[0], paths[1]))
    by_path = dict(zip(paths, loaded))
    comparisons = []
    for pa, pb, *extra in wanted:
        ra = by_path.get(pa) or results_mod.load(pa)
        rb = by_path.get(pb) or results_mod.load(pb)
        bases = [by_path.get(e) or results_mod.load(e) for e in extra]
        label_a = Path(pa).stem + "".join(f" + {Path(e).stem}" for e in extra)
        comparisons.append((label_a, Path(pb).stem, compare_mod.compare(ra, rb, extra_baselines=bases)))
    md = out / "README.md"
    md.write_text(markdown(labelled, images, title=title, note=note, comparisons=comparisons))
    return md
