"""``dlsched kernels install|list|remove``: GPU kernelspecs (``docs/kernels.md``)."""

from __future__ import annotations

import argparse
import json
import sys

from ..vocab.errors import DlschedError
from .common import EXIT_OK


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number such as 1 or 0.5, got {text!r}"
        ) from None


def cmd_install(args: argparse.Namespace) -> int:
    from ..kernels.kernelspecs import GpuKernelRequest, install

    request = GpuKernelRequest(
        gpus=args.gpus,
        gpu_mem=args.gpu_mem,
        cpus=args.cpus,
        mem=args.mem,
        priority=args.priority,
        idle=args.idle,
        idle_grace=args.idle_grace,
        wait_limit=args.wait_limit,
    )
    prefix = sys.prefix if args.sys_prefix else args.prefix
    folder = install(
        request,
        name=args.name,
        display_name=args.display_name,
        user=prefix is None,
        prefix=prefix,
    )
    if args.json:
        print(json.dumps({"name": folder.name, "folder": str(folder), "request": request.config()}))
    else:
        print(f"installed GPU kernelspec {folder.name} ({request.words()}) in {folder}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from ..kernels.kernelspecs import list_specs

    specs = list_specs()
    if args.json:
        print(json.dumps(specs))
        return EXIT_OK
    if not specs:
        print("no GPU kernelspecs; add one: dlsched kernels install --gpus 1")
        return EXIT_OK
    for spec in specs:
        r = spec["request"]
        gpu_mem = f" · {r['gpu_mem']}" if r.get("gpu_mem") else ""
        print(
            f"{spec['name']:<20} {spec['display_name']:<24} {r.get('gpus')} GPU{gpu_mem} · "
            f"idle {r.get('idle')} + {r.get('idle_grace')} · waits {r.get('wait_limit')}  "
            f"{spec['folder']}"
        )
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    from ..kernels.kernelspecs import remove

    for name in args.names:
        folder = remove(name)
        print(f"removed GPU kernelspec {name} ({folder})")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    text = "kernelspecs whose kernels lease GPUs from the pool before they start"
    kernels = sub.add_parser("kernels", help=text, description=text)
    actions = kernels.add_subparsers(dest="kernels_action", metavar="ACTION", required=True)

    i = actions.add_parser("install", help="install a GPU kernelspec of this Python")
    i.add_argument("--gpus", type=_number, default=1.0, help="GPUs each kernel leases (default 1)")
    i.add_argument("--gpu-mem", metavar="SIZE", help="GPU memory of a share, e.g. 8GiB")
    i.add_argument(
        "--cpus",
        type=_number,
        default=None,
        help="CPU cores (default: the GPUs' share of the pool's cores, at most 1)",
    )
    i.add_argument("--mem", metavar="SIZE", help="memory, e.g. 32GiB")
    i.add_argument("--priority", default="normal", help="the lease's priority (default normal)")
    i.add_argument(
        "--idle",
        metavar="DURATION",
        default="30m",
        help="warn after this long without a cell while work waits, or never (default 30m)",
    )
    i.add_argument(
        "--idle-grace",
        metavar="DURATION",
        default="5m",
        help="then reclaim the GPUs after this long without a cell (default 5m)",
    )
    i.add_argument(
        "--wait-limit",
        metavar="DURATION",
        default="10m",
        help="longest wait in line before a start fails, or never (default 10m)",
    )
    i.add_argument("--name", help="the kernelspec's name (default python3-<N>gpu)")
    i.add_argument("--display-name", metavar="TEXT", help="default 'Python 3 · N GPU'")
    where = i.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (the default)")
    where.add_argument("--sys-prefix", action="store_true", help="in this Python's prefix (a venv)")
    where.add_argument("--prefix", metavar="DIR", help="under DIR/share/jupyter/kernels")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(run=cmd_install)

    ls = actions.add_parser("list", help="the GPU kernelspecs Jupyter finds")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(run=cmd_list)

    rm = actions.add_parser("remove", help="remove GPU kernelspecs by name")
    rm.add_argument("names", nargs="+", metavar="NAME")
    rm.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    rm.set_defaults(run=cmd_remove)


__all__ = ["DlschedError", "add_parser"]
