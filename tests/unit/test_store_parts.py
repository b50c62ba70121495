"""The store's shape: ``Store`` is composed of parts, each an object that owns its tables'
writes and is handed the parts it uses; none is built on another, none reaches the whole."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from jupyter_dlsched import store as store_package
from jupyter_dlsched.store import Store
from jupyter_dlsched.store.parts import Via

STORE = Path(store_package.__file__).parent
#: Each table and the store modules (its parts) whose SQL writes it. ``jobs`` is one wide
#: row a job's concerns share: ``lifecycle`` (``jobs.py``) inserts it and is the one writer
#: of its state; ``runs`` writes the columns of a run's hold, ``queue`` those of its place
#: in line.
WRITERS: dict[str, set[str]] = {
    "meta": {"ledger"},
    "events": {"events"},
    "blobs": {"payloads"},
    "blob_refs": {"payloads"},
    "schedules": {"schedules"},
    "jobs": {"jobs", "runs", "queue"},
    "job_inputs": {"staging"},
    "stagings": {"staging"},
    "cache_entries": {"staging"},
    "samples": {"samples"},
}
_WRITE = re.compile(r"\b(?:INSERT(?: OR \w+)? INTO|UPDATE|DELETE FROM)\s+([a-z_]+)")
_SETS = re.compile(r"\bUPDATE jobs SET (.*?)(?: WHERE |$)", re.S)


def statements(source: str) -> list[str]:
    """Every string in ``source``, an f-string's fields as ``{}``: where its SQL is."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            found.append(
                "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            )
    return found


def writes(source: str) -> tuple[set[str], bool, bool]:
    """``(tables written, inserts a job, sets a job's state)`` by the SQL in ``source``."""
    tables: set[str] = set()
    inserts = sets_state = False
    for sql in statements(source):
        tables.update(_WRITE.findall(sql))
        inserts = inserts or bool(re.search(r"INSERT(?: OR \w+)? INTO jobs\b", sql))
        for assigned in _SETS.findall(sql):
            sets_state = sets_state or bool(re.search(r"(?:^|,)\s*state\s*=", assigned))
    return tables, inserts, sets_state


def part_modules() -> dict[str, str]:
    """Each store module that holds SQL, by name, with its source."""
    return {
        path.stem: path.read_text()
        for path in sorted(STORE.glob("*.py"))
        if path.stem not in ("__init__", "parts", "buffers", "settings")
    }


def test_the_write_scanner_sees_sql_in_strings_and_f_strings():
    source = (
        'db.execute("INSERT OR IGNORE INTO blobs(hash) VALUES(?)")\n'
        'db.execute(f"UPDATE jobs SET {sets} WHERE id=?")\n'
        'db.execute("UPDATE jobs SET waiting=?, state=\'x\' " "WHERE id=?")\n'
        'db.execute("DELETE FROM samples WHERE time < ?")\n'
        "# UPDATE stagings is a comment, not SQL\n"
    )
    assert writes(source) == ({"blobs", "jobs", "samples"}, False, True)
    assert writes('x = "SELECT state FROM jobs WHERE state=?"') == (set(), False, False)


def test_each_table_is_written_by_its_parts_only():
    written: dict[str, set[str]] = {}
    for module, source in part_modules().items():
        for table in writes(source)[0]:
            written.setdefault(table, set()).add(module)
    strays = {t: mods - WRITERS.get(t, set()) for t, mods in written.items()}
    assert {t: m for t, m in strays.items() if m} == {}, (
        "a part writes another part's table: call a method of the part that owns it"
    )
    assert set(written) == set(WRITERS), "a table gained or lost its writers: update WRITERS"


def test_only_the_lifecycle_inserts_a_job_or_moves_its_state():
    for module, source in part_modules().items():
        _, inserts, sets_state = writes(source)
        assert not (inserts or sets_state) or module == "jobs", (
            f"store/{module}.py inserts a job or sets its state: that is "
            "Lifecycle.insert_jobs's and Lifecycle.transition_in's (the state machine)"
        )


def test_no_part_is_built_on_another_or_reaches_the_whole(tmp_path):
    store = Store(tmp_path)
    parts = {name: type(part) for name, part in vars(store).items() if hasattr(part, "ledger")}
    parts["ledger"] = type(store.ledger)
    assert len(parts) == 10
    for name, cls in parts.items():
        assert cls.__bases__ == (object,), f"store.{name} ({cls.__name__}) inherits"
        handed = list(inspect.signature(cls).parameters)
        if name != "ledger":  # the one made from the folder; every other is made of parts
            assert set(handed) <= set(parts), f"{cls.__name__} is handed more than parts"
            assert [getattr(store, name).__dict__[p] for p in handed] == [
                getattr(store, p) for p in handed
            ], f"{cls.__name__} keeps the parts it is handed under their names"
    assert Store.__bases__ == (object,)
    for module, source in part_modules().items():
        assert not re.search(r"\bimport Store\b|\bStore\b\)", source), (
            f"store/{module}.py reaches the whole Store: hand it the part it needs"
        )


@pytest.mark.parametrize("name", sorted(n for n, v in vars(Store).items() if isinstance(v, Via)))
def test_each_store_method_is_answered_by_the_part_it_names(tmp_path, name):
    via = vars(Store)[name]
    store = Store(tmp_path)
    owner = via.method.__qualname__.split(".")[0]
    assert type(getattr(store, via.part)).__name__ == owner
    assert getattr(store, name) == getattr(getattr(store, via.part), name)
