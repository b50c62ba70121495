"""The agent protocol's shapes are one table for both ends: every op the agent dispatches
has a request and a reply shape, its handler is typed with them, the client's typed
``call`` has the same ones, and every op the package's code sends is one the agent
answers. Read from the code itself (the dispatch table, the annotations, the sources)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from typing import Any

import jupyter_dlsched
from jupyter_dlsched.agent import shapes
from jupyter_dlsched.agent.service import Agent

PACKAGE = Path(jupyter_dlsched.__file__).parent


def dispatched(folder: Path) -> dict[str, Any]:
    """The agent's dispatch table: op -> handler (an agent made, not started)."""
    return dict(Agent(folder / "home")._ops)


class _Fields:
    """Stands for ``Unpack`` when reading ``Calls.call``'s annotations: ``Unpack[X]`` is X."""

    def __class_getitem__(cls, shape: type) -> type:
        return shape


def client_calls() -> dict[str, tuple[type, type]]:
    """op -> (fields, reply) of each signature of the client's typed ``call``, read from
    ``shapes.py``'s source (``typing.get_overloads`` is Python 3.11's)."""
    names = {**vars(shapes), "Unpack": _Fields, "Literal": typing.Literal}
    tree = ast.parse(Path(shapes.__file__).read_text())
    [calls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Calls"]
    out = {}
    for signature in calls.body:
        if not (
            isinstance(signature, ast.FunctionDef)
            and signature.name == "call"
            and any(ast.unparse(d) == "overload" for d in signature.decorator_list)
        ):
            continue
        [_, op_arg, *_] = signature.args.posonlyargs
        (op,) = typing.get_args(eval(ast.unparse(op_arg.annotation), names))
        fields = signature.args.kwarg
        assert signature.returns is not None
        out[op] = (
            eval(ast.unparse(fields.annotation), names)
            if fields and fields.annotation
            else shapes.NoFields,
            eval(ast.unparse(signature.returns), names),
        )
    return out


def sent_ops() -> dict[str, list[str]]:
    """Every op named in the package's sources where a request is made: the first argument
    of a ``.call(...)`` or ``ask_service(...)``, and the ``"op"`` of a ``notify(...)``'s
    message; op -> where."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            ops: list[ast.expr] = []
            if name in ("call", "ask_service"):
                ops = [node.args[0]]
            elif name == "notify":
                ops = [
                    value
                    for arg in node.args
                    if isinstance(arg, ast.Dict)
                    for key, value in zip(arg.keys, arg.values, strict=True)
                    if isinstance(key, ast.Constant) and key.value == "op"
                ]
            for op in ops:
                if isinstance(op, ast.Constant) and isinstance(op.value, str):
                    where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
                    found.setdefault(op.value, []).append(where)
    return found


def test_every_op_the_agent_dispatches_has_a_request_and_a_reply_shape(tmp_path):
    ops = dispatched(tmp_path)
    assert set(ops) == set(shapes.OPS), "an op without a shape (or a shape of no op)"
    for op, (request, reply) in shapes.OPS.items():
        assert typing.is_typeddict(request) and typing.is_typeddict(reply), op


def test_each_handler_takes_and_returns_its_ops_shapes(tmp_path):
    for op, handler in dispatched(tmp_path).items():
        hints = typing.get_type_hints(handler)
        replies = [t for t in typing.get_args(hints["return"]) if t is not type(None)]
        reply = replies[0] if replies else hints["return"]  # ``changes``: or None, held
        assert (hints["msg"], reply) == shapes.OPS[op], op


def test_the_clients_typed_call_has_the_same_shapes_as_the_agent():
    assert client_calls() == shapes.OPS


def test_every_op_the_package_sends_is_one_the_agent_dispatches(tmp_path):
    sent = sent_ops()
    # the scan sees the typed calls and the supervisor's untyped notify alike
    assert {"submit", "cancel", "changes", "progress", "samples", "ended"} <= set(sent)
    unknown = {op: where for op, where in sent.items() if op not in dispatched(tmp_path)}
    assert not unknown, f"ops the agent would refuse as unknown: {unknown}"
