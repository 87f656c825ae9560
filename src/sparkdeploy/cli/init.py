"""`sparkdeploy init HOST...`: write inventory.yaml from what the boxes report (sparkdeploy.checks.init)."""

from __future__ import annotations

from pathlib import Path

import click

from sparkdeploy.checks import init as init_mod
from sparkdeploy.errors import InputError


def _pairs(option: str, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        node, sep, netdev = v.partition("=")
        if not sep or not node or not netdev:
            raise InputError(f"{option} {v!r}: expected NODE=NETDEV (the node's name as init reports it)")
        out[node] = netdev
    return out


@click.command()
@click.argument("hosts", nargs=-1, required=True, metavar="HOST...")
@click.option("--out", "out", default="inventory.yaml", show_default=True, metavar="FILE",
              help="where to write the inventory")
@click.option("--dry-run", is_flag=True, help="print the inventory on stdout instead of writing it")
@click.option("--force", is_flag=True, help="overwrite an existing --out file")
@click.option("--user", default=None, metavar="U", help="SSH login (default: ~/.ssh/config's User, else root)")
@click.option("--key", default=None, metavar="FILE",
              help="SSH private key (default: ~/.ssh/config's IdentityFile, else the agent); written into the inventory")
@click.option("--known-hosts", "known_hosts", default=None, metavar="FILE",
              help="known_hosts file with the boxes' host keys (default: the kit's and ~/.ssh/known_hosts); "
                   "written into the inventory")
@click.option("--profile", default=None, metavar="P",
              help="model profile for the inventory (default: qwen3.8-flash-next-nvfp4 on GB10s, sim-tiny otherwise)")
@click.option("--head", default=None, metavar="NODE", help="the head node (default: the first linked to every other)")
@click.option("--netdev", "netdevs", multiple=True, metavar="NODE=NETDEV",
              help="the data port where a node has two up ports on one subnet (repeatable)")
@click.option("--cluster", default="spark", show_default=True, metavar="NAME", help="the inventory's cluster name")
@click.option("--trust-new-hosts", is_flag=True, help="accept and record SSH host keys not seen before")
def init(hosts, out, dry_run, force, user, key, known_hosts, profile, head, netdevs, cluster, trust_new_hosts):
    """Read each HOST (an address or an ~/.ssh/config alias) over SSH, one round trip per box: memory, GPU,
    CX-7 ports with their addresses, speed, MTU, RoCE devices and GID indexes, kernel, driver and the netplan or
    NetworkManager files that configured the network (read, never rewritten). Works out the layout (direct
    cable, ring or switch) and writes a commented inventory that `plan` takes as is. Exit 2 where the layout is
    ambiguous: the message lists the choices and the flag that picks one."""
    target = Path(out)
    if not dry_run and target.exists() and not force:
        raise InputError(f"{target} exists: pass --force to overwrite it, --out FILE for another, or --dry-run")
    boxes = init_mod.read_boxes(hosts, user=user, trust_new_hosts=trust_new_hosts, key=key, known_hosts=known_hosts)
    layout = init_mod.work_out(boxes, head=head, netdev=_pairs("--netdev", netdevs))
    text = init_mod.render(layout, user=user, profile=profile, hosts=hosts, cluster=cluster, out=target, key=key,
                           known_hosts=known_hosts)
    if dry_run:
        click.echo(text, nl=False)
        return
    target.write_text(text)
    click.echo(f"wrote {target}: {layout.kind}, head {layout.nodes[0].box.name}, "
               f"{len(layout.nodes)} node(s); next: sparkdeploy plan -i {target}", err=True)


COMMANDS = [init]
