"""``image``: build the training image that Docker mode (and SageMaker, once pushed) runs."""

from __future__ import annotations

from pathlib import Path

import click

from smddp_sdk.cli.common import console


@click.group(short_help="Build the training image (works from an installed package).")
def image() -> None:
    """The training image: torch and smddp-sdk on a Python base, `train` as its command."""


@image.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}, short_help="Build the image (options as scripts/build-image.sh).")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def build(ctx: click.Context, script_args: tuple[str, ...]) -> None:
    """Build the training image; every option goes to the build script:

    \b
    smddp-launch image build                      # CPU image smddp-sdk:<version> (and :latest)
    smddp-launch image build --gpu                # CUDA torch wheels, tag suffix -gpu
    smddp-launch image build --tag my/repo:1 --base-image python:3.11-slim-bookworm
    smddp-launch image build --help               # every option

    Progress goes to stderr, the image name to stdout. Exit code 3 when no Docker engine answers.
    """
    from smddp_sdk import image as image_build

    ctx.exit(image_build.build(script_args))


@image.command(short_help="Write the build context into a folder, to inspect or build by hand.")
@click.argument("target", type=click.Path(file_okay=False, path_type=Path))
@click.pass_context
def context(ctx: click.Context, target: Path) -> None:
    """Write TARGET: the Dockerfile, the `train` shim, this package's source and a pyproject.toml, with
    scripts/build-image.sh to build it (`SMDDP_BUILD_CONTEXT=TARGET TARGET/scripts/build-image.sh`)."""
    from smddp_sdk import image as image_build

    written = image_build.write_context(target)
    console(ctx).say(f"wrote the build context to {written}")
    click.echo(str(written))


COMMANDS = (image,)
