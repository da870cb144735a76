"""``engine._thread_safe_ast``: on the interpreters whose AST constructor shares its recursion depth
between threads, every ``ast.parse`` of the process takes one lock.

The interleaving that breaks them is made on purpose, not waited for: a garbage collection is
forced inside thread A's AST construction (a gc callback sees it is called from within the parse),
and there it lets thread B parse, then waits for B (at most ``WINDOW`` seconds)."""

from __future__ import annotations

import ast
import gc
import sys
import threading

import pytest

import engine  # noqa: F401  (importing the engine installs the lock)
from engine import _thread_safe_ast

RAW_PARSE = getattr(ast.parse, "__wrapped__", ast.parse)
SOURCE = "\n".join(f"x{i} = [{i}, ({i}, {i}), {{'k': {i}}}]" for i in range(200))
WINDOW = 0.5


def b_parses_inside_a_parse(parse) -> tuple[bool, dict[str, SystemError]]:
    """Thread A parses ``SOURCE`` with ``parse``; a collection inside its AST construction waits for
    thread B to start a parse with ``parse`` and (up to ``WINDOW`` s) finish it. Returns whether the
    collection fired inside A's parse and the SystemErrors each thread got."""
    a_paused, b_started, b_done = threading.Event(), threading.Event(), threading.Event()
    a_thread: list[int] = []
    fired: list[bool] = []
    errors: dict[str, SystemError] = {}

    def inside_a_parse(phase: str, info: dict) -> None:
        if phase != "start" or fired or threading.get_ident() not in a_thread:
            return
        if sys._getframe(1).f_code is not RAW_PARSE.__code__:  # a collection outside the C parse: not the one
            return
        fired.append(True)
        a_paused.set()
        b_started.wait(5)
        b_done.wait(WINDOW)

    def a() -> None:
        a_thread.append(threading.get_ident())
        try:
            parse(SOURCE)
        except SystemError as e:
            errors["a"] = e
        a_paused.set()

    def b() -> None:
        a_paused.wait(5)
        b_started.set()
        try:
            parse("y = 1")
        except SystemError as e:
            errors["b"] = e
        b_done.set()

    thresholds = gc.get_threshold()
    gc.callbacks.append(inside_a_parse)
    gc.set_threshold(1)  # every tracked allocation collects: the first node A's constructor makes does
    try:
        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(inside_a_parse)
    return bool(fired), errors


@pytest.mark.parametrize(("version", "needs"), [
    ((3, 11, 0), True), ((3, 11, 7), True), ((3, 11, 8), False), ((3, 12, 0), True), ((3, 12, 1), True),
    ((3, 12, 2), False), ((3, 13, 0), False), ((3, 10, 14), False),
])
def test_the_interpreters_that_need_it(version, needs):
    assert _thread_safe_ast.interpreter_needs_it(version) is needs


def test_importing_the_engine_installs_it_exactly_where_needed():
    assert _thread_safe_ast.installed() is _thread_safe_ast.interpreter_needs_it()
    assert _thread_safe_ast.install() is _thread_safe_ast.installed()  # a second install changes nothing
    if _thread_safe_ast.installed():
        assert not hasattr(ast.parse.__wrapped__, "__wrapped__")  # wrapped once, not once per import
    assert ast.literal_eval("{'descr': '<i8', 'shape': (3, 2)}") == {"descr": "<i8", "shape": (3, 2)}


def test_the_unlocked_parse_fails_on_this_interpreter_exactly_when_it_needs_the_lock():
    """The negative control: the interleaving breaks the bare ``ast.parse`` on an affected
    interpreter (the SystemError numpy's header reads got in a release), and only there."""
    fired, errors = b_parses_inside_a_parse(RAW_PARSE)
    assert fired
    assert ("a" in errors) is _thread_safe_ast.interpreter_needs_it(), errors
    if errors:
        assert "recursion depth mismatch" in str(errors["a"])


def test_the_locked_parse_never_fails():
    """With the lock B waits for A's parse to end (A's collection gives up waiting after the window),
    then both parses succeed."""
    fired, errors = b_parses_inside_a_parse(ast.parse)
    assert fired and errors == {}
