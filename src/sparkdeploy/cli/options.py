"""Options more than one command takes, declared once."""

from __future__ import annotations

import click

INVENTORY_HELP = "inventory file (default: inventory.yaml of the checkout)"


def inventory_option(dest: str = "inventory_file", help: str = INVENTORY_HELP):
    """`--inventory/-i FILE` (default None: the command falls back to `paths.default_inventory()`), passed to the
    command as `dest`."""
    return click.option("--inventory", "-i", dest, default=None, metavar="FILE", help=help)
