"""``python -m jupyter_dlsched.agent --home DIR``: run a pool agent in the foreground."""

import sys

from .service import main

sys.exit(main())
