"""Find the asserts that read a wall-clock time.

Under ``make test`` two notebooks, each with its worker processes, share two cores, so a time,
a ratio of times or an order of times differs from run to run and may flip. A notebook cell or a
test may print a time, but must not assert on one: it asserts on what cannot flip under load
(operator counts, bytes, FLOPs). This module finds the asserts that break that rule.

A value *reads a time* when it comes from a timer (``bench.median_times``, ``bench.seconds``,
``time.perf_counter``, ...), from a training history's ``wall_time``, or from a name or function
that was computed from one. Names are followed in order through assignments, loops, function
definitions and ``append``-like calls, from cell to cell.

An assert inside a function that takes the ``fake_clock`` fixture (``tests/conftest.py``) is
allowed: there the clock is a counter the test controls, and its "times" are exact.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from IPython.core.inputtransformer2 import TransformerManager

TIMERS = {
    "median_times", "seconds", "gpu_time", "copy_bandwidth", "do_bench", "elapsed_time",
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "time", "time_ns", "timeit",
}
TIMED_ATTRIBUTES = {"wall_time"}
MUTATORS = {"append", "extend", "insert", "update", "add", "setdefault"}
FAKE_CLOCK = "fake_clock"


def reads_time(node: ast.AST, timed: set[str]) -> bool:
    """Whether the expression (or statement) ``node`` reads a time."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in timed:
            return True
        if isinstance(n, ast.Attribute) and n.attr in TIMED_ATTRIBUTES:
            return True
        if isinstance(n, ast.Call):
            f = n.func
            if (isinstance(f, ast.Name) and f.id in TIMERS) or (isinstance(f, ast.Attribute) and f.attr in TIMERS):
                return True
    return False


def bound_names(target: ast.AST) -> set[str]:
    """The names an assignment to ``target`` binds or changes: ``a``, ``a, b``, ``a[k]``, ``a.x``."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(bound_names(t) for t in target.elts))
    if isinstance(target, ast.Starred):
        return bound_names(target.value)
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return bound_names(target.value)
    return set()


class Reader(ast.NodeVisitor):
    """Walks code in order, tracking the names that hold a time (``timed``) and collecting the
    asserts that read one. A name bound to something else stops counting as a time; a loop's
    body is walked twice, so that what its first pass binds reaches the whole body."""

    def __init__(self) -> None:
        self.timed: set[str] = set()
        self.asserts: list[ast.Assert] = []

    def bind(self, target: ast.AST, value: ast.AST | None) -> None:
        names = bound_names(target)
        if value is not None and reads_time(value, self.timed):
            self.timed |= names
        elif isinstance(target, (ast.Name, ast.Tuple, ast.List)):
            self.timed -= names

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            self.bind(target, node.value)

    def visit_AugAssign(self, node: ast.AugAssign | ast.AnnAssign | ast.NamedExpr) -> None:
        self.generic_visit(node)
        if node.value is not None and reads_time(node.value, self.timed):
            self.timed |= bound_names(node.target)

    visit_AnnAssign = visit_NamedExpr = visit_AugAssign

    def visit_For(self, node: ast.For | ast.AsyncFor | ast.While) -> None:
        for _ in range(2):
            if not isinstance(node, ast.While):
                self.bind(node.target, node.iter)
            for stmt in node.body:
                self.visit(stmt)
        for stmt in node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_While = visit_For

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for stmt in node.body:
            self.visit(stmt)
        if any(reads_time(stmt, self.timed) for stmt in node.body):
            self.timed.add(node.name)
        else:
            self.timed.discard(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in MUTATORS and any(reads_time(a, self.timed) for a in [*node.args, *node.keywords]):
            self.timed |= bound_names(f.value)

    def visit_Assert(self, node: ast.Assert) -> None:
        if reads_time(node.test, self.timed) and node not in self.asserts:  # a loop's body is walked twice
            self.asserts.append(node)


def on_fake_clock(tree: ast.AST) -> set[int]:
    """The line numbers of the functions that take the ``fake_clock`` fixture."""
    lines = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and FAKE_CLOCK in {a.arg for a in n.args.args}:
            lines.update(range(n.lineno, n.end_lineno + 1))
    return lines


def timing_asserts(sources: Sequence[str]) -> list[tuple[int, int, str]]:
    """``(index, line, code)`` of each assert that reads a time, in ``sources`` (the code cells
    of one notebook in order, or one Python file); IPython magics are allowed."""
    reader = Reader()
    found = []
    for i, text in enumerate(sources):
        code = TransformerManager().transform_cell(text)
        tree = ast.parse(code)
        reader.asserts = []
        reader.visit(tree)
        allowed = on_fake_clock(tree)
        found += [(i, n.lineno, ast.get_source_segment(code, n)) for n in reader.asserts if n.lineno not in allowed]
    return found


def order_asserts_beside_timers(cells: Sequence[str]) -> list[tuple[int, int, str]]:
    """``(index, line, code)`` of each assert on an order (``<``, ``<=``, ``>``, ``>=``) in a
    notebook cell that also calls a timer. Even when the order is of counts, a reader of such a
    cell cannot tell it from an order of the times beside it: the cell that times only prints,
    and a cell of its own asserts on counts or bytes."""
    orders = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
    found = []
    for i, text in enumerate(cells):
        code = TransformerManager().transform_cell(text)
        tree = ast.parse(code)
        if reads_time(tree, set()):
            found += [(i, n.lineno, ast.get_source_segment(code, n)) for n in ast.walk(tree) if isinstance(n, ast.Assert)
                      and any(isinstance(op, orders) for c in ast.walk(n.test) if isinstance(c, ast.Compare) for op in c.ops)]
    return found
