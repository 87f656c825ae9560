"""The only place that parses argv, prints and exits.

Each module in this package defines one command or group of commands and lists them in `COMMANDS`;
they are discovered here so adding a command touches one file.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

from sparkdeploy import __version__, timing
from sparkdeploy.errors import SparkdeployError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sparkdeploy")
def cli() -> None:
    """Deploy and supervise vLLM on one or two NVIDIA DGX Spark boxes (or the simulated cluster).

    Exit codes: 0 ok, 1 failure, 2 invalid input, 3 a release that `up`, `rollback` or `vocab rollout` put live
    serves but its speed sentinel found it slower beyond noise (`--allow-slower` accepts it: exit 0)."""


def _register_commands() -> None:
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for command in getattr(module, "COMMANDS", ()):
            cli.add_command(command)


_register_commands()


# Verbs that deploy or undeploy a release: timed as "deploy" spans (sparkdeploy.timing) when a log is asked for.
_DEPLOY_VERBS = {("up",), ("rollback",), ("down",), ("vocab", "rollout")}


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; turn every SparkdeployError into one line on stderr and its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    verb = next((v for v in _DEPLOY_VERBS if tuple(args[:len(v)]) == v), None)
    if verb is None:
        return _run(args)
    with timing.span("deploy", " ".join(verb)):
        return _run(args)


def _run(argv: list[str]) -> int:
    try:
        # Without standalone mode click returns (not raises) the code of ctx.exit(N) / click Exit.
        result = cli.main(args=argv, prog_name="sparkdeploy", standalone_mode=False)
    except SparkdeployError as err:
        click.secho(f"error: {err}", fg="red", err=True)
        return err.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as err:
        err.show()
        return 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
