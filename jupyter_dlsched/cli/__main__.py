"""``python -m jupyter_dlsched.cli``: the same as the ``dlsched`` command."""

import sys

from .app import main

sys.exit(main())
