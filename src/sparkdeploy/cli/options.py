"""Options (and the report lines) more than one command shares, declared once."""

from __future__ import annotations

import click

INVENTORY_HELP = "inventory file (default: inventory.yaml of the checkout)"


SERVICE_HELP = ("the service of the inventory's `services:` to act on (default: the only one); NAME/R: replica R of a "
                "service with `replicas:`")
_SERVICE_KEY = "sparkdeploy.service"


def inventory_option(dest: str = "inventory_file", help: str = INVENTORY_HELP):
    """`--inventory/-i FILE` (default None: the command falls back to `paths.default_inventory()`), passed to the
    command as `dest`; and `--service NAME`, which every command that reads the inventory takes: it is kept
    for `chosen_service()` rather than passed, so no command's signature carries it."""
    def decorate(f):
        f = click.option("--service", metavar="NAME", default=None, expose_value=False, help=SERVICE_HELP,
                         callback=lambda ctx, _param, value: ctx.meta.__setitem__(_SERVICE_KEY, value))(f)
        return click.option("--inventory", "-i", dest, default=None, metavar="FILE", help=help,
                            callback=_named_file)(f)
    return decorate


def _named_file(_ctx, _param, value: str | None) -> str | None:
    """`-i ''` (an unset variable in a script) is refused: falling back to the default would act on another
    inventory than the one meant."""
    if value is not None and not value.strip():
        raise click.BadParameter("empty; name the inventory file, or leave the option out for the default")
    return value


def chosen_service() -> str | None:
    """The `--service` of the running command (None: not given, or no command is running)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(_SERVICE_KEY) if ctx is not None else None


def selected_services(inventory: str | None) -> tuple:
    """The services a command that covers several acts on: --service's (every replica of a service named without
    `/R`), else every service of the inventory (one `Inventory` each; `.service` None for an inventory without
    `services:`)."""
    from sparkdeploy import paths
    from sparkdeploy.model import inventory as inventory_mod

    path = inventory or paths.default_inventory()
    views, chosen = inventory_mod.load_services(path), chosen_service()
    if chosen is None:
        return views
    replicas = tuple(v for v in views if v.replica and v.service == chosen)
    return replicas or (inventory_mod.select(views, chosen, path),)


SLOWER = 3
"""Exit code of `up`, `rollback`, `vocab rollout`/`rollback` when the release serves but its sentinel found it slower
beyond noise: a scripted deploy must notice (issue 17: a slower draft list went unnoticed for five days)."""


def sentinel_option(f):
    """`--sentinel/--no-sentinel` and `--allow-slower` for the commands that put a release live (`up`, `rollback`,
    `vocab rollout`, `vocab rollback`)."""
    f = click.option("--allow-slower", is_flag=True,
                     help=f"exit 0 when the sentinel finds the release slower beyond noise (else exit {SLOWER}; "
                          "the release serves either way)")(f)
    return click.option("--sentinel/--no-sentinel", default=True, show_default=True,
                        help="after the gate of a (re)started release, a short speed probe per prompt category, "
                             "kept with the release and compared with the previous healthy release's "
                             "(docs/monitoring.md)")(f)


def deploy_exit_code(served: bool, speeds, allow_slower: bool) -> int:
    """1 when the release does not serve; SLOWER when it serves but a sentinel verdict of `speeds` (None: not
    measured) is a regression beyond noise and `--allow-slower` was not given; else 0."""
    if not served:
        return 1
    slower = any(speed and speed.get("regression") for speed in speeds)
    return SLOWER if slower and not allow_slower else 0


def speed_after_gate(cluster, number: int, log, *, against: int | None = None) -> dict:
    """The sentinel's verdict on release `number`, which just passed its gate; a probe that fails is reported
    in the verdict, never fails the command (the release is healthy and serves)."""
    import requests

    from sparkdeploy.bench import sentinel
    from sparkdeploy.errors import SparkdeployError

    log(f"sentinel: measuring release {number} (a short probe per prompt category)")
    try:
        return sentinel.check_release(cluster, number, against=against)
    except (SparkdeployError, requests.RequestException, ValueError, KeyError) as e:
        return {"regression": False, "text": f"not measured: {e}", "against": None}


def print_speed(console, speed: dict | None, allow_slower: bool = False) -> None:
    if speed:
        from rich.markup import escape

        console.print(("[yellow bold]" if speed.get("regression") else "[green]") + "sentinel: "
                      + escape(speed["text"]))
        if speed.get("regression"):
            console.print("[yellow]the release serves; " + ("accepted (--allow-slower)" if allow_slower else
                          f"exit {SLOWER} (--allow-slower accepts a slower release)") + "[/yellow]")


def connected(inventory: str | None, trust_new_hosts: bool):
    """The inventory's cluster, every node connected (for commands that only read or flip files)."""
    from sparkdeploy import paths
    from sparkdeploy.steps.deploy import Options, load_context

    cluster = load_context(inventory or str(paths.default_inventory()), Options(trust_new_hosts=trust_new_hosts),
                           chosen_service())
    cluster.connect([])
    return cluster
