"""`sparkdeploy schema inventory|profile|facts`: the JSON Schema of a config file, from its one declaration
(`model/schema.py`), for an editor's YAML support (`# yaml-language-server: $schema=inventory.schema.json`)."""

from __future__ import annotations

import json

import click
from pydantic import TypeAdapter

from sparkdeploy.model import schema as shapes

_FILES = {"inventory": shapes.InventoryFile, "profile": shapes.ProfileFile, "facts": shapes.FactsFile}


@click.command("schema")
@click.argument("file", type=click.Choice(sorted(_FILES)))
def schema(file: str) -> None:
    """Print the JSON Schema of FILE's shape: its keys, types, ranges, defaults and what each expects. The kit
    checks more than a schema can say (one head, unique addresses, ports across services); `plan` says all."""
    click.echo(json.dumps(TypeAdapter(_FILES[file]).json_schema(), indent=2))


COMMANDS = [schema]
