"""The environment ``make lab`` and ``make test`` build: what they leave out on purpose."""

from __future__ import annotations

import subprocess
import sys


def test_jsonschema_comes_without_its_slow_iri_checker():
    """``make`` removes ``rfc3987-syntax`` (Makefile, ``drop_slow_iri_checker``): it builds
    some thirty parsers whenever jsonschema is imported, which every Jupyter server, Ray
    worker and notebook job does, and no Jupyter schema uses the formats it checks."""
    probe = "import sys, jupyter_server.serverapp; print('rfc3987_syntax' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "False", (
        "jsonschema's IRI checker is installed: run `make install`, or "
        "`pip uninstall rfc3987-syntax` (docs/jupyterlab.md)"
    )
