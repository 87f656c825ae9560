"""The CLI is the one place that turns outcomes into exit codes."""

import click

from sparkdeploy import cli
from sparkdeploy.errors import InventoryError


def _run_with(command: click.Command, argv: list[str]) -> int:
    cli.cli.add_command(command)
    try:
        return cli.main([command.name, *argv])
    finally:
        cli.cli.commands.pop(command.name)


def test_ctx_exit_code_reaches_the_caller():
    @click.command("exit-probe")
    @click.pass_context
    def probe(ctx):
        ctx.exit(1)

    assert _run_with(probe, []) == 1


def test_input_error_is_exit_2_with_the_field_named(capsys):
    @click.command("raise-probe")
    def probe():
        raise InventoryError("expected an IPv4 address", file="inv.yaml", field="nodes[1].data_ip")

    assert _run_with(probe, []) == 2
    assert "inv.yaml: nodes[1].data_ip: expected an IPv4 address" in capsys.readouterr().err


def test_usage_error_is_exit_2():
    assert cli.main(["no-such-command"]) == 2


def test_help_is_exit_0(capsys):
    assert cli.main(["--help"]) == 0
    assert "Usage" in capsys.readouterr().out
