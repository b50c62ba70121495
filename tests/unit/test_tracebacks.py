"""A function defined in a notebook fails in its job with its cell's name and lines."""

from __future__ import annotations

import linecache
import subprocess
import sys

from jupyter_dlsched.vocab.tracebacks import dumps

LOADS_AND_CALLS = """
import sys, traceback, cloudpickle
fn = cloudpickle.loads(sys.stdin.buffer.read())
try:
    fn(0)
except ZeroDivisionError:
    traceback.print_exc()
"""


def cell_function(source: str, filename: str):
    """A function as a notebook cell makes one: its lines in linecache, no file on disk."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["boom"]


def test_a_cells_function_fails_in_another_process_with_its_cells_name_and_line():
    boom = cell_function("def boom(x):\n    return 1/x\n", "<ipython-input-7-0a1b2c>")
    shown = subprocess.run(
        [sys.executable, "-c", LOADS_AND_CALLS],
        input=dumps(boom),
        capture_output=True,
        check=True,
    ).stderr.decode()
    assert 'File "<ipython-input-7-0a1b2c>", line 2, in boom\n    return 1/x' in shown, shown
    assert "<dynamic-code>" not in shown


def test_only_lines_that_exist_nowhere_else_travel(tmp_path):
    in_a_cell = cell_function("def boom(x):\n    return 1/x\n", "<ipython-input-8-3d4e5f>")
    on_disk = tmp_path / "helpers.py"
    on_disk.write_text("def boom(x):\n    return 2/x  # read from the file\n")
    namespace: dict = {"__name__": "__main__"}
    exec(compile(on_disk.read_text(), str(on_disk), "exec"), namespace)
    pickled = dumps({"cell": in_a_cell, "file": namespace["boom"]})
    assert b"return 1/x" in pickled
    assert str(on_disk).encode() in pickled and b"read from the file" not in pickled
