"""``dlsched submit --notebook PATH [-p NAME=VALUE]... [--output PATH] [--kernel NAME]``."""

from __future__ import annotations

import argparse
from typing import Any

from ..nbjobs.params import parse_parameter
from ..vocab.errors import SpecError
from .common import CommandError


def _parameter(text: str) -> tuple[str, Any]:
    try:
        return parse_parameter(text)
    except SpecError:
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE with NAME a Python name, such as lr=3e-4, got {text!r}"
        ) from None


def add_notebook_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a notebook job (its resources are the common flags)."""
    parser.add_argument(
        "--notebook",
        metavar="PATH",
        help="run this notebook as the job; its executed copy is the job's result",
    )
    parser.add_argument(
        "-p",
        "--parameter",
        dest="parameters",
        metavar="NAME=VALUE",
        type=_parameter,
        action="append",
        help="a notebook parameter, injected after the cell tagged `parameters` "
        "(VALUE is a Python literal, else text; repeatable)",
    )
    parser.add_argument(
        "--output",
        metavar="PATH",
        help="where the executed notebook goes (default: NAME.<job id>.ipynb next to it)",
    )
    parser.add_argument(
        "--kernel", metavar="NAME", help="kernelspec to run it with (default: the notebook's)"
    )


def notebook_request(args: argparse.Namespace, argv: list[str]) -> dict[str, Any] | None:
    """The ``submit_notebook`` arguments the flags ask for; None for a command job."""
    notebook_only = [
        flag
        for flag, value in (
            ("-p", args.parameters),
            ("--output", args.output),
            ("--kernel", args.kernel),
        )
        if value
    ]
    if args.notebook is None:
        if notebook_only:
            raise CommandError(f"{notebook_only[0]} is for a notebook job: add --notebook PATH")
        return None
    if argv:
        raise CommandError(
            "give either --notebook PATH or a command after --, not both "
            f"(got the command {' '.join(argv)!r})"
        )
    return {
        "path": args.notebook,
        "parameters": dict(args.parameters or []),
        "output": args.output,
        "kernel": args.kernel,
    }
