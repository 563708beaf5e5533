"""The suite's own rules, kept by a scan of ``tests/`` (AST, not grep: comments and strings do not count).

A test that asserts how long something took on the real clock passes on a quiet machine
and fails on a loaded one (or the reverse, for a check that something did *not* happen
within a sleep); a ``pytest.raises(Exception)`` passes on the wrong failure; a skipped
import of a declared test dependency turns a broken install into a green run. So:

* no assertion on elapsed real time: no ``time.monotonic()``/``perf_counter()``/``time()``
  difference (directly, or through a name it was assigned to) compared in an ``assert``;
  ``trio.current_time()`` may be compared only in a test on the virtual clock
  (``autojump_clock``), where it is exact. Latency may be printed, or measured in ``benchmarks/``;
* no ``pytest.raises(Exception)`` or ``(BaseException)``, alone or in a tuple: name the error;
* no bare ``except:`` or ``except Exception``/``BaseException`` whose body is only ``pass``;
* no ``pytest.importorskip`` at module level: a declared test dependency is imported;
* no ``capsys.disabled()`` / ``capfd.disabled()``: a figure a test prints stays in its captured
  output (``pytest -rP`` shows it), never as a stray line among the dots.

What a scan cannot see stays a review rule: a bare sleep used to wait for something
before an assertion (wait for an event, or poll under a deadline), a port bound, closed
and handed on (hold it, or bind port 0 in the process that serves), and a narrow
``except`` around the very failure a test provokes (use ``pytest.raises``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).parent
REAL_CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}
VIRTUAL_CLOCK_FIXTURES = {"autojump_clock", "mock_clock"}
TOO_BROAD = {"Exception", "BaseException"}


def sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(TESTS.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(TESTS.parent)}:{node.lineno}: {ast.unparse(node).splitlines()[0][:100]}"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _clock_call(node: ast.AST, virtual: bool) -> bool:
    """A read of the real clock (or of trio's, outside a virtual-clock test)."""
    if not isinstance(node, ast.Call):
        return False
    name = _dotted(node.func)
    if name in {f"time.{c}" for c in REAL_CLOCKS} or name in {"monotonic", "perf_counter"}:
        return True
    return name == "trio.current_time" and not virtual


def _elapsed(node: ast.AST, virtual: bool, names: set[str]) -> bool:
    """An expression that contains a difference involving a clock read, or a name holding one."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub):
            if any(_clock_call(side, virtual) for side in (sub.left, sub.right)):
                return True
        if isinstance(sub, ast.Name) and sub.id in names:
            return True
    return False


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def elapsed_time_assertions(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for function in _functions(tree):
        virtual = bool({a.arg for a in function.args.args} & VIRTUAL_CLOCK_FIXTURES)
        names: set[str] = set()
        for node in ast.walk(function):  # names assigned a clock difference, anywhere in the function
            if isinstance(node, ast.Assign) and _elapsed(node.value, virtual, set()):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and _elapsed(node.value, virtual, set()):
                names.add(node.target.id)
        for node in ast.walk(function):
            if isinstance(node, ast.Assert):
                compares = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)]
                if any(_elapsed(c, virtual, names) for c in compares):
                    found.append(where(path, node))
    return found


def broad_raises(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func) == "pytest.raises" and node.args:
            expected = node.args[0]
            kinds = expected.elts if isinstance(expected, ast.Tuple) else [expected]
            if any(_dotted(kind) in TOO_BROAD for kind in kinds):
                found.append(where(path, node))
    return found


def swallowed_failures(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and all(isinstance(s, ast.Pass) for s in node.body):
            kinds = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            if node.type is None or any(_dotted(kind) in TOO_BROAD for kind in kinds):
                found.append(where(path, node))
    return found


def module_level_importorskip(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and _dotted(node.func) == "pytest.importorskip":
                found.append(where(path, node))
    return found


def output_past_capture(path: Path, tree: ast.Module) -> list[str]:
    return [where(path, node) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _dotted(node.func) in ("capsys.disabled", "capfd.disabled")]  # fmt: skip


def test_no_assertion_on_elapsed_real_time():
    assert [hit for path, tree in sources() for hit in elapsed_time_assertions(path, tree)] == []


def test_no_pytest_raises_of_any_exception():
    assert [hit for path, tree in sources() for hit in broad_raises(path, tree)] == []


def test_no_broad_exception_swallowed():
    assert [hit for path, tree in sources() for hit in swallowed_failures(path, tree)] == []


def test_no_module_level_importorskip():
    assert [hit for path, tree in sources() for hit in module_level_importorskip(path, tree)] == []


def test_no_output_past_the_capture():
    assert [hit for path, tree in sources() for hit in output_past_capture(path, tree)] == []


# -- the scanner itself, on what it must and must not flag ---------------------------------------

BAD = '''
import time, trio, pytest
mcp = pytest.importorskip("mcp")

def test_timed():
    started = time.monotonic()
    work()
    latency = time.monotonic() - started
    assert latency < 1.0

def test_inline():
    t0 = time.perf_counter()
    assert time.perf_counter() - t0 < 2

async def test_trio_real_clock():
    started = trio.current_time()
    assert trio.current_time() - started >= 0.2

def test_broad():
    with pytest.raises(Exception):
        work()
    with pytest.raises((ValueError, BaseException)):
        work()
    try:
        work()
    except Exception:
        pass

def test_loud(capsys):
    with capsys.disabled():
        print("a stray line")
'''

GOOD = '''
import time, trio, pytest

async def test_virtual(autojump_clock):
    started = trio.current_time()
    await trio.sleep(0.2)
    assert trio.current_time() - started == 0.2

def test_printed():
    started = time.monotonic()
    work()
    print(f"took {time.monotonic() - started:.2f} s")
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, "hang guard"

def test_specific():
    with pytest.raises(ValueError):
        work()
    try:
        work()
    except ValueError:
        pass

def test_skip_inside():
    pytest.importorskip("optional_thing")
'''


def test_the_scanner_flags_each_broken_rule_and_nothing_else():
    bad, good = ast.parse(BAD), ast.parse(GOOD)
    path = TESTS / "example.py"
    assert len(elapsed_time_assertions(path, bad)) == 3
    assert len(broad_raises(path, bad)) == 2
    assert len(swallowed_failures(path, bad)) == 1
    assert len(module_level_importorskip(path, bad)) == 1
    assert len(output_past_capture(path, bad)) == 1
    for check in (elapsed_time_assertions, broad_raises, swallowed_failures, module_level_importorskip,
                  output_past_capture):  # fmt: skip
        assert check(path, good) == [], check.__name__
