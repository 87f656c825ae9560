"""`sparkdeploy profile import FILE`: a recipe from the community kit or sparkrun, as a sparkdeploy profile."""

from __future__ import annotations

from pathlib import Path

import click

from sparkdeploy import paths
from sparkdeploy.errors import InventoryError
from sparkdeploy.model import checkpoint
from sparkdeploy.model import recipe as recipe_mod


def _newest_series() -> str:
    """The newest vLLM series whose flag catalogue the kit ships (deploy/vllm-flags/<series>.json)."""
    shipped = [p.stem for p in (paths.repo_root() / "deploy" / "vllm-flags").glob("*.json")]
    return max(shipped, key=lambda s: tuple(int(x) for x in s.split(".")))


@click.group("profile")
def profile() -> None:
    """Model profiles (deploy/profiles/NAME.yaml)."""


@profile.command("import")
@click.argument("recipe_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="where to write the profile (default: deploy/profiles/<recipe file name>.yaml)")
@click.option("--dry-run", is_flag=True, help="print the profile instead of writing it")
@click.option("--vllm-version", default=None,
              help="check the command's flags against this vLLM (the inventory's image.vllm_version; default: the "
                   "newest the kit ships a flag catalogue for)")
@click.option("--weights-gib", type=click.FloatRange(0, 4096), default=None,
              help="the checkpoint's size in GiB (a recipe does not say; the plan's memory figures need it)")
@click.option("--kv-bytes-per-token", type=click.IntRange(0, 1 << 30), default=None,
              help="KV cache bytes per token per rank at the recipe's TP")
@click.option("--checkpoint-format", type=click.Choice(checkpoint.KNOWN_FORMATS), default=None,
              help="the checkpoint's format (a recipe rarely says; else the plan reads it on the head)")
def import_command(recipe_file: Path, out: Path | None, dry_run: bool, vllm_version: str | None,
                   weights_gib: float | None, kv_bytes_per_token: int | None, checkpoint_format: str | None) -> None:
    """Import RECIPE_FILE (the community kit's recipes/*.yaml or a sparkrun recipe) as a profile.

    Every `vllm serve` flag is checked against the pinned vLLM; flags the kit owns go to their profile fields or are
    listed as inventory settings; what a profile cannot hold (mods, build args, custom containers, wrappers) is
    listed in the file's header and here, never dropped silently."""
    series = _newest_series() if vllm_version is None else _series(vllm_version)
    target = out or paths.profiles_dir() / f"{recipe_file.stem}.yaml"
    imported = recipe_mod.import_recipe(recipe_file, series=series, name=target.stem, weights_gib=weights_gib,
                                        kv_bytes_per_token=kv_bytes_per_token, checkpoint_format=checkpoint_format)
    text = imported.to_yaml(recipe_file.name)
    if dry_run:
        click.echo(text, nl=False)
        return
    if target.exists():
        raise InventoryError(f"{target} exists; choose another --out (or remove it)", field="--out")
    target.write_text(text)
    click.echo(f"wrote {target} ({imported.kind}, flags checked against vLLM {series})")
    for title, items in (("set in the inventory", imported.inventory), ("not carried over", imported.unmapped)):
        for item in items:
            click.echo(f"  {title}: {item}", err=True)


def _series(version: str) -> str:
    from spark_overlays import compat

    try:
        return compat.series(version)
    except compat.CompatError as err:
        raise InventoryError(str(err), field="--vllm-version") from None


COMMANDS = [profile]
