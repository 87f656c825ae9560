"""`sparkdeploy weights fetch`, `sparkdeploy weights sync [--dry-run]` and `sparkdeploy weights evict`."""

from __future__ import annotations

import json
import os

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from sparkdeploy import paths
from sparkdeploy.cli.options import inventory_option
from sparkdeploy.errors import InputError, RemoteError
from sparkdeploy.model import inventory as inventory_mod
from sparkdeploy.ops import model_fetch as mf
from sparkdeploy.ops import weights as w
from sparkdeploy.remote.ssh import Pool, target_of
from sparkdeploy.verdict import Status

err = Console(stderr=True, highlight=False, soft_wrap=True)
GIB = 1 << 30

_inventory = inventory_option()
_dir = click.option("--dir", "directory", default=None, metavar="PATH",
                    help="checkpoint directory, the same path on every node (default: the profile's model.host_dir)")
_trust = click.option("--trust-new-hosts", is_flag=True, help="accept and record SSH host keys not seen before")


@click.group()
def weights() -> None:
    """The checkpoint on the nodes: fetch it from the Hub onto the head, copy it head -> others over the data
    plane, drop its page cache."""


def _load(inventory_file, directory):
    inv = inventory_mod.load(inventory_file or paths.default_inventory())
    d = directory or inv.profile.host_dir
    if not d:
        raise InputError("the profile has no model.host_dir (the model is baked into the image): pass --dir PATH")
    return inv, d


def _open(inv, trust_new_hosts, nodes=None) -> Pool:
    pool = Pool([target_of(n.name, n.ssh) for n in nodes or inv.nodes], trust_new_hosts=trust_new_hosts)
    errors = pool.open()
    if errors:
        pool.close()
        name, e = next(iter(errors.items()))
        raise RemoteError(str(e).split(": ", 1)[-1] if str(e).startswith(name) else str(e), node=name)
    return pool


@weights.command()
@_inventory
@click.option("--revision", default="main", show_default=True, help="branch, tag or commit of model.id")
@click.option("--offline", is_flag=True,
              help="take the files from the head's HF cache only (also when HF_HUB_OFFLINE is set here)")
@click.option("--hf-home", default=mf.HF_HOME, show_default=True, metavar="PATH",
              help="the head's Hugging Face home; the hub cache is its hub/ (the engine mounts the same one)")
@click.option("--dry-run", is_flag=True, help="look in the head's cache only and say what would be placed; write nothing")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON on stdout")
@_trust
def fetch(inventory_file, revision, offline, hf_home, dry_run, as_json, trust_new_hosts):
    """Download the profile's model.id (a Hugging Face repo) once on the head into its HF cache, with
    huggingface_hub in a container of the pinned base image (a re-run keeps what an interrupted one fetched; token from auth.hf_token_file), and
    place the files at model.host_dir (hard links into the cache). Then run `sparkdeploy weights sync`."""
    inv = inventory_mod.load(inventory_file or paths.default_inventory())
    spec = mf.spec_of(inv, revision=revision, offline=mf.is_offline(offline, os.environ), hf_home=hf_home,
                      endpoint=os.environ.get("HF_ENDPOINT"))
    head = inv.head
    mode = "from the cache only (offline)" if spec.offline or dry_run else "from the Hub (files already in the cache are kept)"
    err.print(f"{spec.repo_id}@{spec.revision} -> {head.name}:{spec.host_dir}, {mode}, huggingface_hub in {spec.image}")
    with _open(inv, trust_new_hosts, [head]) as pool, \
            Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                     TransferSpeedColumn(), console=err, transient=True) as prog:
        tasks = {}

        def progress(event):
            if event.get("unit") != "B":
                return
            desc = event["progress"]
            if desc not in tasks:
                tasks[desc] = prog.add_task(desc, total=event.get("total"))
            prog.update(tasks[desc], completed=event.get("n", 0), total=event.get("total"))

        res = mf.fetch(pool.conns[head.name], spec, dry_run=dry_run, progress=progress)
    if res.token_used:
        err.print("  with the token of auth.hf_token_file")
    if res.commit is None:
        err.print(f"  not in the head's cache ({spec.cache}): a fetch would download it")
    elif res.already_there:
        err.print(f"  already there: {res.files} files, {res.bytes / GIB:.2f} GiB of commit {res.commit[:12]}")
    else:
        verb = "would place" if dry_run else "placed"
        err.print(f"  {verb} {res.linked + res.copied} of {res.files} files ({res.linked} hard-linked, {res.copied} "
                  f"copied), {res.bytes / GIB:.2f} GiB of commit {res.commit[:12]}")
    if res.commit is not None and not dry_run and len(inv.nodes) > 1:
        err.print("  next: sparkdeploy weights sync (copies it to the other nodes)")
    if as_json:
        click.echo(json.dumps({"head": head.name, **res.to_dict()}, indent=2))


@weights.command()
@_inventory
@_dir
@click.option("--dry-run", is_flag=True, help="compare manifests and print the exact commands that would copy; "
              "copy nothing")
@click.option("--streams", type=click.IntRange(1, 16), default=None,
              help=f"parallel rsync streams (default: one per {w.CORES_PER_STREAM} head cores, at most "
                   f"{w.MAX_STREAMS}: one SSH stream is bound by one core's cipher speed)")
@click.option("--json", "as_json", is_flag=True, help="print the result per node as JSON on stdout")
@_trust
def sync(inventory_file, directory, dry_run, streams, as_json, trust_new_hosts):
    """Copy the checkpoint from the head to every other node over the data-plane IPs (rsync); skip nodes whose
    size+sha256 manifest already equals the head's."""
    inv, d = _load(inventory_file, directory)
    head = inv.head
    with _open(inv, trust_new_hosts) as pool:
        # rsync logs in as root: the one-time key is authorized by the node helper, which runs as root (sudo)
        ep = {n.name: w.Endpoint(pool.conns[n.name], n.name, n.data_ip) for n in inv.nodes}
        err.print(f"manifest of {d} on {head.name} (hashes cached after the first run)...")
        src = w.manifest(pool.conns[head.name], d)
        err.print(f"  {len(src.files)} files, {src.bytes / GIB:.2f} GiB ({src.hashed / GIB:.2f} GiB hashed now)")
        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), console=err, transient=True) as prog:
            tasks = {}

            def progress(node, done, total):
                if node not in tasks:
                    tasks[node] = prog.add_task(f"{head.name} -> {node}", total=total)
                prog.update(tasks[node], completed=done)

            results = w.sync(ep[head.name], [ep[n.name] for n in inv.nodes if n.name != head.name], d,
                             dry_run=dry_run, head_manifest=src, streams=streams, progress=progress)
    for r in results:
        rate = f", {r.rate / 1e6:.0f} MB/s" if r.status is Status.CHANGED else ""
        err.print(f"  {r.status.value:<12} {r.node:<9} {r.detail} ({r.bytes / GIB:.2f} GiB in {r.seconds:.1f} s{rate})")
        if r.extra:
            err.print(f"{'':>23}[dim]{len(r.extra)} file(s) only on {r.node} left alone: {', '.join(r.extra[:3])}[/dim]")
        for e in r.effects if dry_run else []:
            err.print(f"{'':>23}[dim]{escape(e)}[/dim]")
    if as_json:
        click.echo(json.dumps({"dir": d, "head": head.name, "files": len(src.files), "bytes": src.bytes,
                               "nodes": [r.to_dict() for r in results]}, indent=2))


@weights.command()
@_inventory
@_dir
@click.option("--json", "as_json", is_flag=True, help="print the result per node as JSON on stdout")
@_trust
def evict(inventory_file, directory, as_json, trust_new_hosts):
    """Drop the checkpoint's page cache on every node (posix_fadvise DONTNEED, no root), then run the start-time
    memory guard: MemAvailable must cover the plan's weights + KV + reserve. Exit 1 when it would refuse."""
    from sparkdeploy import plan as plan_mod
    from sparkdeploy.ops import gather

    inv, d = _load(inventory_file, directory)
    with _open(inv, trust_new_hosts) as pool:
        measured = pool.map(lambda c: gather.gather(c, inv.node(c.name)))
        bad = {k: v for k, v in measured.items() if isinstance(v, Exception)}
        if bad:
            name, e = next(iter(bad.items()))
            raise RemoteError(str(e), node=name)
        plan = plan_mod.plan(inv, measured)
        out, guards = w.evict_and_guard(pool, plan, d)
    for g in guards:
        ev = out[g.node]
        cached = "" if ev.get("cached_before") is None else \
            f", page cache {ev['cached_before'] / GIB:.2f} -> {ev['cached_after'] / GIB:.2f} GiB"
        err.print(f"  {g.node:<9} {ev['files']} files, {ev['bytes'] / GIB:.2f} GiB{cached}; MemAvailable "
                  f"{ev['mem_available_before'] / GIB:.1f} -> {ev['mem_available_after'] / GIB:.1f} GiB")
        style = {"ok": "green", "warn": "yellow", "failed": "red bold"}.get(g.status.value, "")
        err.print(f"  [{style}]{g.status.value:<6}[/{style}] {g.node:<9} memory guard: {g.reason}")
    if as_json:
        click.echo(json.dumps({"dir": d, "nodes": out, "guard": [g.to_dict() for g in guards]}, indent=2))
    w.enforce(guards)


COMMANDS = [weights]
