"""`sparkdeploy plan` (show every command, env var, file and memory figure) and `sparkdeploy render --out DIR`."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import click

from sparkdeploy import paths
from sparkdeploy import plan as plan_mod
from sparkdeploy.cli.options import chosen_service, inventory_option, selected_services
from sparkdeploy.model import inventory as inventory_mod
from sparkdeploy.model.facts_file import load_facts_file
from sparkdeploy.node import layout
from sparkdeploy.plan import render as render_mod
from sparkdeploy.plan.router import ROUTER_VERSION, plan_router, router_files

_inventory_option = inventory_option()
_facts_option = click.option("--facts", "facts_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                             help="node facts YAML (default: nominal 128 GB GB10 / simulated-node facts, nothing "
                                  "is read; a 64 GB Spark needs its own)")
_nodes_option = click.option("--nodes", type=click.IntRange(min=1), default=None,
                             help="plan this many nodes: 1 = single box, or the profile's tp x pp x dp")


def build_plans(inventory_file: str | Path | None, facts_file: Path | None,
                nodes: int | None) -> dict[str | None, plan_mod.Plan]:
    """Load inventory (+ facts file) and plan each selected service (--service's, else every one), by its key
    (`NAME/R` for a replica); shared by commands that need plans without touching nodes."""
    services = selected_services(inventory_file)
    given = load_facts_file(facts_file) if facts_file else {}
    unknown = sorted(set(given) - {n.name for inv in inventory_mod.load_services(inventory_file or
                                                                                 paths.default_inventory())
                                   for n in inv.nodes})
    if unknown:
        raise inventory_mod.InventoryError(f"node(s) {', '.join(unknown)} are not in the inventory",
                                           file=str(facts_file), field="nodes")
    return {inv.key: plan_mod.plan(inv, {n.name: given[n.name] for n in inv.nodes if n.name in given} or None, nodes,
                                   git_commit=paths.git_commit(), overlays_digest=render_mod.overlays_digest())
            for inv in services}


def _wrap(command: str, indent: str = "    ") -> str:
    return textwrap.fill(command, width=110, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def _why(p: plan_mod.Plan, feat) -> str:
    """Why a patch is on or off, and how this vLLM pin does it (the overlays' compat table)."""
    from spark_overlays import compat

    how = compat.support(p.image.vllm_version, feat.name).note
    return (f"on, {feat.mode}" + (f": {how}" if how else "")) if feat.enabled else f"off: {feat.reason}"


def _per_pin(p: plan_mod.Plan) -> list[str]:
    """Each patch on every vLLM series the kit supports (image.vllm_version picks one): native flag, overlay, or
    off on that pin whatever the inventory asks, with why."""
    from spark_overlays import compat

    here = compat.series(p.image.vllm_version)
    lines = []
    for series, row in sorted(compat.TABLE.items(), key=lambda kv: tuple(map(int, kv[0].split(".")))):
        lines.append(f"  vLLM {series}.x{' (this plan)' if series == here else ''}: " + "  ".join(
            f"{name}={'off' if row[name].off_by_default else row[name].mode}" for name in compat.FEATURES))
        lines += [f"    {name} off on {series}: {row[name].off_by_default}" for name in compat.FEATURES
                  if row[name].off_by_default]
    return lines


def format_plan(p: plan_mod.Plan) -> str:
    lines = [
        f"cluster {p.cluster}  profile {p.profile}  nodes {p.nnodes}  tp {p.tp}  pp {p.pp}  release {p.release_id}",
        f"image   {p.image.tag}  (FROM {p.image.base}; vLLM {p.image.vllm_version})",
        *(f"  path  {t}" for t in p.image.transfers),
        f"api     {p.api_url}   " + (f"Ray's head port {p.master_port} (backend ray)" if p.backend == "ray"
                                        else f"master port {p.master_port}"),
        "start   " + " -> ".join(f"{n.name} ({n.role})" for n in p.start_order),
        "patches " + "  ".join(f"{f.name}={'on' if f.enabled else 'off'}({f.mode})" for f in p.features),
        *(f"  {f.name:<13} {_why(p, f)}" for f in p.features),
        "pins    per patch on each supported vLLM series (image.vllm_version picks one)",
        *_per_pin(p),
        "weights " + (f"{p.checkpoint.format} (from {p.checkpoint.source})" if p.checkpoint else "format unknown"),
        *(f"  path  {t}" for t in p.weights_transfers),
        "secrets " + ("  ".join(f"{k} {v}" for k, v in p.secrets.items()) + f" in {p.layout.secrets_env} (0600)"
                      if p.secrets else "none: the API on port %d takes requests without a key" % p.api_port),
    ]
    for n in p.nodes:
        lines += ["", f"== {n.name}: {n.role}, rank {n.rank}, starts #{n.start_order + 1}, "
                      f"ssh {n.ssh.user}@{n.ssh.host}:{n.ssh.port}, data {n.data_ip} on {n.netdev}"
                      + (f", hca {','.join(n.hca)}" if n.hca else "")]
        runs = n.serve_argv[0] + " " + n.serve_argv[1]  # `vllm serve`, or `ray start` on a ray worker
        docker_only = shlex.join(n.docker_argv[: len(n.docker_argv) - len(n.serve_argv)]) + f" <{runs} above>"
        lines += [f"  {runs}:", _wrap(n.serve_command), "  docker run:", _wrap(docker_only), "  env:"]
        lines += [f"    {k}={v}" for k, v in n.env.items()] or ["    (none)"]
        lines += ["  files:"] + [f"    {rel}  ->  {dest}" for rel, dest in n.files.items()]
        lines += ["  memory:"] + [f"    {label:<24} {value}" for label, value in n.memory.rows()]
    if p.notes:
        lines += ["", "notes:"] + [f"  - {note}" for note in p.notes]
    return "\n".join(lines)


@click.command("plan")
@_nodes_option
@_inventory_option
@_facts_option
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
def plan_command(nodes: int | None, inventory_file: str | None, facts_file: Path | None, as_json: bool) -> None:
    """Show what each node will run: role, rank, commands, env, files, memory budget. Touches nothing.
    With `services:`, every service (or the one --service names)."""
    plans = build_plans(inventory_file, facts_file, nodes)
    router = _router(inventory_file)
    if as_json:
        data = next(iter(plans.values())).to_dict() if len(plans) == 1 else \
            {"services": {key: p.to_dict() for key, p in plans.items()}}
        click.echo(json.dumps({**data, **({"router": router.to_dict()} if router else {})}, indent=2, sort_keys=True, allow_nan=False))
    else:
        click.echo("\n\n".join((f"service {key}\n" if len(plans) > 1 else "") + format_plan(p)
                                for key, p in plans.items()))
        if router:
            click.echo(f"\nrouter  {router.url} on {router.node.name} (vllm-router {ROUTER_VERSION}, "
                       f"{layout.ROUTER_UNIT}; every request needs the API key)")
            click.echo("\n".join(f"  model {w.model:<20} -> service {w.key} at {w.url}" for w in router.workers))


def _router(inventory_file: str | Path | None):
    """The router's plan when the command covers every service of an inventory that names one."""
    if chosen_service():
        return None
    return plan_router(inventory_mod.load_services(inventory_file or paths.default_inventory()))


@click.command("render")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="directory to write the artifacts to (DIR/<node>/..., DIR/image/Dockerfile; with several "
                   "services, DIR/<service>/...)")
@_nodes_option
@_inventory_option
@_facts_option
def render_command(out_dir: Path, nodes: int | None, inventory_file: str | None, facts_file: Path | None) -> None:
    """Write every artifact (Dockerfile, env files, launch scripts, units, plan.json) under DIR, and
    prometheus-targets.json: every service head's exporter, for deploy/monitoring/prometheus.yml."""
    plans = build_plans(inventory_file, facts_file, nodes)
    for key, p in plans.items():
        where = out_dir / key if len(plans) > 1 else out_dir  # a replica's under DIR/<service>/<R>
        for path in render_mod.write(p, where):
            click.echo(str(path))
        click.echo(f"{'service ' + key + ': ' if key else ''}release {p.release_id}: {p.nnodes} node(s) "
                   f"rendered to {where}", err=True)
    if any(p.metrics_port for p in plans.values()):
        targets = out_dir / render_mod.PROMETHEUS_TARGETS
        targets.write_bytes(render_mod.prometheus_targets(list(plans.values())))
        click.echo(str(targets))
    router = _router(inventory_file)
    if router:
        for name, data in router_files(router).items():
            path = out_dir / "router" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            click.echo(str(path))


COMMANDS = [plan_command, render_command]
