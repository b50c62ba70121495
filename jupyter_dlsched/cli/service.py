"""``dlsched service run``: a shared pool's service in the foreground (systemd, tests)."""

from __future__ import annotations

import argparse
import logging

from .common import EXIT_OK, CommandError

DEFAULT_HOME = "/var/lib/dlsched"


def cmd_service(args: argparse.Namespace) -> int:
    from ..agent.client import SYSTEM_SOCKET
    from ..agent.config import ServiceConfig
    from ..agent.service import Agent

    config = ServiceConfig.load(args.config)
    socket_path = args.socket or SYSTEM_SOCKET
    home = args.service_home or DEFAULT_HOME
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    metrics = None
    if args.metrics:
        from ..agent.scrape import parse_address

        metrics = parse_address(args.metrics)
    agent = Agent(home, socket_path, config=config, metrics=metrics)
    if not agent.bind():
        raise CommandError(f"another service already answers on {socket_path}")
    try:
        agent.open()  # a state folder users cannot reach is refused here, in one line
        logging.getLogger("jupyter_dlsched.agent").info(
            "serving the pool in %s on %s (policy %s)", home, socket_path, config.policy
        )
        if agent.scrape is not None:
            host, port = agent.scrape.address
            logging.getLogger("jupyter_dlsched.agent").info(
                "Prometheus metrics at http://%s:%s/metrics", host, port
            )
        from ..agent.service import _set_name, preload

        preload()
        _set_name(b"dlsched-agent")
        agent.run()
    finally:
        agent.close()
    return EXIT_OK


UNIT = """\
[Unit]
Description=jupyter-dlsched: one GPU job pool for every user of this machine
After=network.target

[Service]
ExecStart={python} -m jupyter_dlsched.cli service run --home {home} --socket {socket}{config}
Restart=on-failure
# stopping the service must not stop running jobs: each has a supervisor of its own
KillMode=process
# each connection is a descriptor: room for every user's kernels, CLIs and Jupyter servers
LimitNOFILE=65536
# a cgroup subtree of its own: each job gets a cgroup below it, so a job cannot leave
# processes behind that outlive it (on a cgroup-v1 host the freezer hierarchy is used)
Delegate=yes
RuntimeDirectory=dlsched
RuntimeDirectoryPreserve=yes
StateDirectory=dlsched
StateDirectoryMode=0711

[Install]
WantedBy=multi-user.target
"""


def cmd_unit(args: argparse.Namespace) -> int:
    """Print the systemd unit for this interpreter (``> /etc/systemd/system/dlsched.service``)."""
    import sys

    from ..agent.client import SYSTEM_SOCKET

    config = f" --config {args.config}" if args.config else ""
    print(
        UNIT.format(
            python=sys.executable,
            home=args.service_home or DEFAULT_HOME,
            socket=args.socket or SYSTEM_SOCKET,
            config=config,
        ),
        end="",
    )
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    text = "run a shared pool for every user of this machine (as root, under systemd)"
    service = sub.add_parser("service", help=text, description=text)
    actions = service.add_subparsers(dest="service_action", metavar="ACTION", required=True)
    run = actions.add_parser("run", help="serve in the foreground until stopped (SIGTERM)")
    run.add_argument(
        "--home",
        dest="service_home",
        help=f"the pool's state folder (default {DEFAULT_HOME})",
    )
    run.add_argument(
        "--socket", help="the socket clients connect to (default /run/dlsched/dlsched.sock)"
    )
    run.add_argument(
        "--config", help="the pool's configuration (default /etc/dlsched/service.toml)"
    )
    run.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="also serve Prometheus metrics at http://HOST:PORT/metrics (HOST: loopback if "
        "left out, e.g. --metrics :9464)",
    )
    run.set_defaults(run=cmd_service)
    unit = actions.add_parser(
        "unit", help="print a systemd unit that runs the service with this interpreter"
    )
    unit.add_argument("--home", dest="service_home", help=f"state folder (default {DEFAULT_HOME})")
    unit.add_argument("--socket", help="the socket (default /run/dlsched/dlsched.sock)")
    unit.add_argument("--config", help="a configuration file to pass to the service")
    unit.set_defaults(run=cmd_unit)
