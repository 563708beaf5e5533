"""The protocol core does no I/O and holds no process-wide state: checked on the source.

Every module of ``mesh/`` outside ``mesh/runtime/`` is a function of its inputs (events and
``now`` in, effects out), so tests and the simulator run it under a virtual clock and an
in-memory network. Only the runtime may know trio, sockets, HTTP, zeroconf or the clock.
"""

from __future__ import annotations

import ast
from pathlib import Path

MESH = Path(__file__).resolve().parents[2] / "mesh"
RUNTIME = MESH / "runtime"
IO = {"trio", "time", "socket", "threading", "httpx", "h11", "hypercorn", "zeroconf"}


def core_modules() -> list[Path]:
    return sorted(p for p in MESH.rglob("*.py") if RUNTIME not in p.parents)


def imported(tree: ast.AST) -> set[str]:
    """The top-level packages a module imports, anywhere in it (a function's own import too)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_core_is_found():
    names = {p.name for p in core_modules()}
    assert {"engine.py", "wire.py", "diffs.py", "memory.py"} <= names and "driver.py" not in names


def test_no_core_module_imports_io_or_a_clock():
    offenders = {
        str(path.relative_to(MESH.parent)): sorted(imported(ast.parse(path.read_text(), str(path))) & IO)
        for path in core_modules()
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def test_no_core_module_holds_a_lock_at_module_level():
    # What the codec shares between decodings lives in a DecodeCache its owner passes in: no
    # lock (nor anything else a lock would guard) sits at module level.
    for path in core_modules():
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
                func = node.value.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                assert name not in {"Lock", "RLock", "Condition", "Semaphore"}, f"{path.name}:{node.lineno}"


def test_the_codec_keeps_nothing_between_calls_unless_handed_a_cache():
    # Two decodings without a cache share no object; under one cache they share the diff's
    # decoding; two caches (two owners: two engines, two simulator parts) share nothing.
    from mesh.identity import NodeIdentity
    from mesh.wire import DecodeCache, Envelope, MsgType, PeerPayload, decode_envelope, encode_envelope, sign_diff

    me = NodeIdentity.generate()
    diff = sign_diff(PeerPayload("n1"), origin=me.node_id, seq=1, ts=1, sign=me.sign)
    frame = encode_envelope(Envelope(MsgType.GOSSIP, 1, "n1", {me.node_id: (me.public_key, bytes(32))}, (diff,)))

    def payload(cache=None):
        return decode_envelope(frame, cache=cache).diffs[0].payload

    assert payload() == payload() and payload() is not payload()
    ours, theirs = DecodeCache(), DecodeCache()
    assert payload(ours) is payload(ours)
    assert payload(theirs) is not payload(ours) and payload(theirs) == payload(ours)
