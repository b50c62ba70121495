"""``dlsched``: the queue from a shell.

    dlsched status
    dlsched queue [--all] [--mine | -u USER] [--state S[,S]] [--name 'sweep-*']
    dlsched submit --gpus 1 --priority high [--wait] -- python train.py --lr 3e-4
    dlsched cancel JOB_ID [JOB_ID ...] | cancel --name 'sweep-*' [-u USER] [--state queued]
    dlsched logs [-f] JOB_ID
    dlsched history [--since 30d] [--mine | -u USER]
    dlsched priority JOB_ID high
    dlsched requeue JOB_ID [JOB_ID ...]
    dlsched sim TRACE --gpus 8 --policy fifo,priority
    dlsched kernels install --gpus 1 [--idle 30m] | kernels list | kernels remove NAME

Every command takes ``--json`` for machine-readable output. A failure is one
line on stderr, ``dlsched <command>: what was wrong and what to do``, with the
exit status listed in ``EXIT_STATUSES`` (``--debug`` adds the traceback).
"""

from .app import main
from .common import (
    EXIT_CLOSED_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STATUSES,
    EXIT_USAGE,
    CommandError,
)
from .jobs import cmd_cancel, cmd_logs, cmd_priority, cmd_requeue, cmd_submit
from .parser import build_parser
from .reports import cmd_history, cmd_queue, cmd_status

__all__ = [
    "EXIT_CLOSED_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_USAGE",
    "CommandError",
    "build_parser",
    "cmd_cancel",
    "cmd_history",
    "cmd_logs",
    "cmd_priority",
    "cmd_queue",
    "cmd_requeue",
    "cmd_status",
    "cmd_submit",
    "main",
]
