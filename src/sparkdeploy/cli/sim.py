"""`sparkdeploy sim ...`: a local simulated cluster (systemd + OpenSSH + Docker "nodes") running a real vLLM."""

from __future__ import annotations

import json
import time

import click

from sparkdeploy.sim._proc import Reporter


class _RichReporter(Reporter):
    """Progress on stderr (stdout stays clean for --json): one line per finished phase with its time."""

    def __init__(self, quiet: bool = False) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.quiet = quiet
        self._status = None

    def phase_started(self, name: str, detail: str = "") -> None:
        if self.quiet:
            return
        self._status = self.console.status(f"{name} {detail}".strip())
        self._status.start()

    def phase_done(self, name: str, seconds: float, detail: str = "") -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if not self.quiet:
            self.console.print(f"[green]✓[/green] {name:<38} [bold]{seconds:7.1f} s[/bold]  [dim]{detail}[/dim]")

    def note(self, message: str) -> None:
        if not self.quiet:
            self.console.print(f"  [dim]{message}[/dim]")


def _cluster(name: str | None, reporter: Reporter):
    from sparkdeploy.sim.cluster import SimCluster

    return SimCluster(name, reporter=reporter)


_name_option = click.option("--name", "name", envvar="SPARKDEPLOY_SIM_NAME", default=None, metavar="NAME",
                            help="cluster name, so several sim clusters can coexist (env SPARKDEPLOY_SIM_NAME; "
                                 "default: demo)")


@click.group("sim")
def sim() -> None:
    """A simulated cluster on this machine: N nodes with systemd, OpenSSH and their own Docker engine.

    Nodes are containers on a user network with fixed IPs, reachable by SSH with a generated key and host-key
    checking on. `sim up` writes inventory.sim.yaml, which every other command accepts (--inventory).
    """


@sim.command("up")
@click.option("--nodes", "-n", "count", type=click.IntRange(1, 8), default=2, show_default=True,
              help="number of nodes (node1 is the head)")
@click.option("--node-names", help="comma-separated node names instead of node1,node2,...")
@_name_option
@click.option("--inventory", "-o", type=click.Path(dir_okay=False), default=None,
              help="where to write the inventory (default: ./inventory.sim.yaml for the 'demo' cluster, else the "
                   "state directory)")
@click.option("--profile", default="sim-tiny", show_default=True, help="model profile named in the inventory")
@click.option("--user", default="nvidia", show_default=True,
              help="SSH login made on every node, with passwordless sudo as on DGX OS (root: log in as root)")
@click.option("--subnet", help="IPv4 /24 for the sim network (default: a free 172.30.x.0/24)")
@click.option("--mtu", type=click.IntRange(576, 9216),
              help="MTU of the sim network when it is created (9000: jumbo frames, as the CX-7 data plane wants)")
@click.option("--ring", is_flag=True,
              help="cable the nodes as a ring, as NVIDIA Sync does for 3 Sparks: a network (own /24) per link "
                   "node1-node2, node2-node3, node3-node1, each node on its two; the inventory lists its `links:`")
@click.option("--engine-image/--no-engine-image", default=True, show_default=True,
              help="also build (or reuse) the vLLM CPU engine base image the serving image builds on")
@click.option("--with-image", "with_images", multiple=True, metavar="IMAGE",
              help="a host image every new node starts out holding, as a Spark holds the vLLM image pulled before "
                   "the kit came (repeatable; copied from a seed volume by hard links, in seconds)")
@click.option("--rebuild", is_flag=True, help="rebuild the node image even if cached")
@click.option("--json", "as_json", is_flag=True, help="print the cluster (nodes, IPs, key, inventory) as JSON")
def up(count, node_names, name, inventory, profile, user, subnet, mtu, ring, engine_image, with_images, rebuild,
       as_json) -> None:
    """Build (once) the node image and start the nodes; wait until each runs systemd, sshd and dockerd."""
    from pathlib import Path

    reporter = _RichReporter()
    t0 = time.monotonic()
    cluster = _cluster(name, reporter)
    names = [n.strip() for n in node_names.split(",") if n.strip()] if node_names else None
    base_image_id = None
    if engine_image:
        from sparkdeploy.sim import images

        base_image_id = images.image_id(images.ensure_engine_image(reporter).ref)
    state = cluster.up(len(names) if names else count, names=names, inventory=Path(inventory) if inventory else None,
                       subnet=subnet, profile=profile, rebuild=rebuild, base_image_id=base_image_id, mtu=mtu,
                       user=user, ring_links=ring, with_images=with_images)
    total = round(time.monotonic() - t0, 1)
    if as_json:
        click.echo(json.dumps({**state.to_dict(), "timings": reporter.timings, "total_seconds": total}, indent=2))
        return
    click.echo(f"sim cluster {state.name!r} up in {total} s ({state.subnet}, image {state.image})")
    for node in state.nodes:
        click.echo(f"  {node.name:<8} {node.role:<6} {node.ip:<15} container {node.container}")
        for link in node.links:
            click.echo(f"  {'':<8} link   {link.netdev} {link.ip}/{link.prefix} to {link.peer} ({link.network})")
    click.echo(f"inventory: {state.inventory} (login {state.user}, key {state.key})")
    click.echo(f"ssh:       sparkdeploy sim ssh {state.head.name}" + (f" --name {state.name}" if name else ""))


@sim.command("down")
@_name_option
@click.option("--keep-volumes", is_flag=True, help="keep each node's Docker volume (its loaded images)")
@click.option("--json", "as_json", is_flag=True)
def down(name, keep_volumes, as_json) -> None:
    """Remove the nodes, their Docker volumes, the networks (a ring's links too), the inventory and known_hosts."""
    reporter = _RichReporter(quiet=as_json)
    t0 = time.monotonic()
    removed = _cluster(name, reporter).down(keep_volumes=keep_volumes)
    total = round(time.monotonic() - t0, 1)
    if as_json:
        click.echo(json.dumps({"removed": removed, "seconds": total}))
    else:
        click.echo(f"removed {len(removed)} Docker objects in {total} s")


@sim.command("reboot")
@click.argument("nodes", nargs=-1, required=True)
@_name_option
@click.option("--timeout", type=float, default=180, show_default=True, help="seconds to wait per node")
@click.option("--json", "as_json", is_flag=True)
def reboot(nodes, name, timeout, as_json) -> None:
    """Reboot NODE... (or `all`): restart the node container, wait for a new PID 1, systemd, ssh and docker."""
    reporter = _RichReporter(quiet=as_json)
    which = "all" if "all" in nodes else list(nodes)
    secs = _cluster(name, reporter).reboot(which, timeout=timeout)
    if as_json:
        click.echo(json.dumps({"seconds": secs}))
    else:
        for node, s in secs.items():
            click.echo(f"{node}: back in {s:.1f} s (new PID 1, systemd up, ssh by key ok)")


@sim.command("status")
@_name_option
@click.option("--json", "as_json", is_flag=True)
def status(name, as_json) -> None:
    """Show each node: container, boot time (PID 1 start), systemd state, ssh, docker and its containers."""
    st = _cluster(name, Reporter()).status()
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    click.echo(f"sim cluster {st['name']!r}: {st['subnet']} image {st['image']}")
    click.echo(f"inventory {st['inventory']}")
    for n in st["nodes"]:
        booted = time.strftime("%H:%M:%S", time.localtime(n["booted_at"])) if n["booted_at"] else "-"
        click.echo(f"  {n['name']:<8} {n['ip']:<15} {n['container_state']:<8} booted {booted}  systemd "
                   f"{n['system'] or '-'}  ssh {'ok' if n['ssh'] else 'NO'}  docker {n['docker'] or '-'}")
        for c in n["containers"]:
            click.echo(f"      {c.get('name', '')}  {c.get('image', '')}  {c.get('status', '')}")


@sim.command("ssh", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("node")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_name_option
def ssh(node, command, name) -> None:
    """Open a shell on NODE as the login user, or run `-- CMD ...` there as root (through sudo, like the kit's own
    commands) and exit with its exit code."""
    from sparkdeploy.errors import SimError

    command = list(command)
    if command[:1] == ["--"]:
        command = command[1:]
    cluster = _cluster(name, Reporter())
    rc = cluster.ssh(node, command or None, interactive=not command)
    if rc == 255:  # ssh's own failure: say so; a command's exit code passes through silently, as with ssh
        err = SimError(f"{node}: ssh exited with 255 (is the node up? `sparkdeploy sim status`)")
        err.exit_code = rc
        raise err
    if rc != 0:
        raise click.exceptions.Exit(rc)


@sim.command("image")
@click.option("--node/--no-node", "node", default=True, show_default=True, help="the node image")
@click.option("--engine/--no-engine", "engine", default=True, show_default=True, help="the engine base image")
@click.option("--rebuild", is_flag=True, help="build even if a cached image matches the inputs")
@click.option("--json", "as_json", is_flag=True)
def image(node, engine, rebuild, as_json) -> None:
    """Build (or confirm cached) the sim node image and the vLLM CPU engine base image."""
    from sparkdeploy.sim import images

    reporter = _RichReporter(quiet=as_json)
    results = {}
    if node:
        results["node"] = images.ensure_node_image(reporter, force=rebuild).__dict__
    if engine:
        results["engine"] = images.ensure_engine_image(reporter, force=rebuild).__dict__
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        for kind, r in results.items():
            click.echo(f"{kind}: {r['ref']} ({'built in %.1f s' % r['seconds'] if r['built'] else 'cached'})")


@sim.command("load")
@click.argument("image_ref")
@click.argument("nodes", nargs=-1)
@_name_option
@click.option("--json", "as_json", is_flag=True)
def load(image_ref, nodes, name, as_json) -> None:
    """Copy a host image into the nodes' Docker engines (one save stream | ssh docker load; all nodes at once)."""
    reporter = _RichReporter(quiet=as_json)
    res = _cluster(name, reporter).preload(image_ref, list(nodes) or None)
    if as_json:
        click.echo(json.dumps(res))
    elif res["nodes"]:
        click.echo(f"loaded {image_ref} into {', '.join(res['nodes'])}: {res['bytes'] / 1e9:.2f} GB in "
                   f"{res['seconds']} s")
    else:
        click.echo(f"every node already has {image_ref}")


COMMANDS = [sim]
