"""Diffs: the payload types, one signed change, and its canonical encoding, both ways.

A **diff** is one signed change by its *origin* node: ``cell``, ``tombstone``,
``beacon``, ``unbeacon``, ``scene`` or ``peer``. Its signed part is the msgpack
encoding of ``[1, kind, origin, seq, ts, body]`` where ``body`` is a fixed-order array
per kind (maps inside bodies are key-sorted), so the encoding is canonical by
construction. The signed bytes travel as they were signed: relays forward them
untouched and receivers verify them before decoding a field of trust. Only the
routing fields, ``hops``, remaining ``ttl`` and (partial view, optional) the nodes
already sent the diff (:mod:`mesh.told`), sit outside the signature (the frame that
carries them is :mod:`mesh.wire`'s). :func:`decode_signed` raises :class:`WireError`
for any malformed input, never another exception type.

A signature says who made a diff, not that it is sound: a member's cell must also obey
the rules every local cell obeys (:mod:`mesh.cell_rules`: one of the nine types, content
and metadata within their limits, metadata plain JSON, times and salience in range), and
``seq``, ``hops`` and ``ttl`` must fit SQLite's signed 64-bit integers. A diff that breaks
them is refused here (``invalid_cell``, ``content_too_large``, ``malformed``), before
anything is logged, relayed or stored: a diff that decodes is one every node can keep.

The codec keeps no state of its own. Whoever decodes many frames (an engine; a simulator's
part, for its thousands of engines) may hand the decoders a :class:`DecodeCache` it owns, so
that the same signed bytes are decoded once and the objects shared; without one, every
decoding starts afresh, with the same result. Node ids convert between hex and raw bytes
through :func:`id_bytes` and :func:`id_hex`, pure functions memoised with
``functools.lru_cache`` like the project's other memos: what they keep is a function of
their argument alone, never of who called them before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
from collections.abc import Callable, Iterator
from typing import Any, Union

import msgpack
import numpy as np

from . import cell_rules as rules
from .errors import CellRuleError, Reason, WireError
from .told import MAX_TOLD, TOLD_ID_BYTES

__all__ = [
    "DiffKind", "CONTROL_KINDS", "DATA_KINDS", "WireLimits", "DEFAULT_LIMITS",
    "CellPayload", "TombstonePayload", "BeaconPayload", "UnbeaconPayload", "ScenePayload", "PeerPayload", "Payload",
    "Diff", "sign_diff", "decode_signed", "DecodeCache", "diff_key", "DIFF_KEY_BYTES", "id_bytes", "id_hex",
]  # fmt: skip

_DIFF_FORMAT = 1
_ORIGIN_BYTES = 16


class DiffKind(enum.IntEnum):
    CELL = 1
    TOMBSTONE = 2
    BEACON = 3
    UNBEACON = 4
    SCENE = 5
    PEER = 6


CONTROL_KINDS = frozenset({DiffKind.BEACON, DiffKind.UNBEACON, DiffKind.SCENE, DiffKind.PEER})
DATA_KINDS = frozenset({DiffKind.CELL, DiffKind.TOMBSTONE})


@dataclasses.dataclass(frozen=True)
class WireLimits:
    """What a decoder holds its input to (a frame, and each diff in it)."""

    max_frame_bytes: int = 4 * 1024 * 1024
    max_diffs: int = 256
    max_content_bytes: int = 64 * 1024
    max_metadata_bytes: int = 16 * 1024
    max_vector_dim: int = 4096
    max_digest_entries: int = 100_000
    max_text_chars: int = 4096  # ids, names, queries, addresses


DEFAULT_LIMITS = WireLimits()


# Node ids are hex in memory and 16 raw bytes on the wire, and every frame names a few.
@functools.lru_cache(maxsize=1 << 18)
def id_bytes(node_id: str) -> bytes:
    return bytes.fromhex(node_id)


@functools.lru_cache(maxsize=1 << 18)
def id_hex(raw: bytes) -> str:
    if len(raw) != _ORIGIN_BYTES:
        raise _fail("node id: expected 16 bytes")
    return raw.hex()


DIFF_KEY_BYTES = 12


def diff_key(origin: str, seq: int) -> bytes:
    """A compact name for ``(origin, seq)``: 8 bytes of the origin, 4 of the seq. The seq's bits
    above 32 (the top of its incarnation, :mod:`mesh.incarnation`) are mixed into those 4, so
    the same low bits in two runs of a node give two names (a seq below 2^32 keeps its own)."""
    return id_bytes(origin)[:8] + ((seq + (seq >> 32) * 0x9E3779B1) & 0xFFFFFFFF).to_bytes(4, "big")


# -- payloads -------------------------------------------------------------------------


def _vectors_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _fields_equal(a: Any, b: object) -> bool:
    """Dataclass equality that compares the ``embedding`` arrays by value."""
    if type(b) is not type(a):
        return NotImplemented
    return all(
        _vectors_equal(getattr(a, f), getattr(b, f)) if f == "embedding" else getattr(a, f) == getattr(b, f)
        for f in a.__dataclass_fields__
    )


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class CellPayload:
    """A cell as plain data plus its vector (float32, L2-normalised)."""

    node_id: str
    tenant_id: str
    source_agent: str
    content: str
    cell_type: str
    salience: float
    created_at: int
    project: str | None = None
    scene_id: str | None = None
    source_ref: dict[str, str] | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    embedding: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))
    embedding_space: str = ""

    def __eq__(self, other: object) -> bool:
        return _fields_equal(self, other)


@dataclasses.dataclass(frozen=True, slots=True)
class TombstonePayload:
    """A forgotten cell; ``cell_origin``/``cell_seq`` name the cell diff for routing."""

    cell_id: str
    tenant_id: str
    forgotten_at: int
    cell_origin: str | None = None
    cell_seq: int = 0


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class BeaconPayload:
    """A standing interest of one principal."""

    beacon_id: str
    tenant_id: str
    agent_id: str
    query: str
    threshold: float
    cell_types: tuple[str, ...] | None = None
    project: str | None = None
    min_salience: float | None = None
    expires_at: int | None = None
    embedding: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))
    embedding_space: str = ""
    scope_projects: tuple[str, ...] = ()  # the owner's read scope; () reads every project

    def __eq__(self, other: object) -> bool:
        return _fields_equal(self, other)


@dataclasses.dataclass(frozen=True, slots=True)
class UnbeaconPayload:
    beacon_id: str
    tenant_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class ScenePayload:
    scene_id: str
    tenant_id: str
    data: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class PeerPayload:
    """A member's announcement of itself: where it listens."""

    address: str
    tenant_id: str = ""


Payload = Union[CellPayload, TombstonePayload, BeaconPayload, UnbeaconPayload, ScenePayload, PeerPayload]


@dataclasses.dataclass(frozen=True, slots=True)
class Diff:
    """One signed change. ``signed`` is exactly what ``signature`` covers."""

    kind: DiffKind
    origin: str
    seq: int
    ts: int
    payload: Payload
    signed: bytes
    signature: bytes
    hops: int = 0
    ttl: int = 0
    told: bytes = b""  # routing: names of nodes already sent this diff (mesh.told), empty if none

    @property
    def tenant(self) -> str:
        return self.payload.tenant_id

    @property
    def size(self) -> int:
        """Bytes on the wire, near enough for batching."""
        return len(self.signed) + len(self.signature) + len(self.told) + 12

    def routed(self, hops: int, ttl: int, told: bytes = b"") -> "Diff":
        # The constructor, not dataclasses.replace: this runs once per diff per hop and per gossip reply.
        return Diff(
            self.kind, self.origin, self.seq, self.ts, self.payload, self.signed, self.signature, hops, ttl, told
        )


# -- canonical encoding ---------------------------------------------------------------


def _canon(value: Any) -> Any:
    """Sort map keys recursively so equal data always encodes to equal bytes."""
    if isinstance(value, dict):
        return {k: _canon(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return value


def _vector_bytes(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


def _body(payload: Payload) -> tuple[DiffKind, list[Any]]:
    p = payload
    if isinstance(p, CellPayload):
        return DiffKind.CELL, [
            p.node_id, p.tenant_id, p.source_agent, p.content, p.cell_type, float(p.salience),
            int(p.created_at), p.project, p.scene_id, _canon(p.source_ref), _canon(p.metadata or {}),
            _vector_bytes(p.embedding), p.embedding_space,
        ]  # fmt: skip
    if isinstance(p, TombstonePayload):
        return DiffKind.TOMBSTONE, [p.cell_id, p.tenant_id, int(p.forgotten_at), p.cell_origin, int(p.cell_seq)]
    if isinstance(p, BeaconPayload):
        return DiffKind.BEACON, [
            p.beacon_id, p.tenant_id, p.agent_id, p.query, float(p.threshold),
            list(p.cell_types) if p.cell_types is not None else None, p.project,
            None if p.min_salience is None else float(p.min_salience), p.expires_at,
            _vector_bytes(p.embedding), p.embedding_space, list(p.scope_projects),
        ]  # fmt: skip
    if isinstance(p, UnbeaconPayload):
        return DiffKind.UNBEACON, [p.beacon_id, p.tenant_id]
    if isinstance(p, ScenePayload):
        return DiffKind.SCENE, [p.scene_id, p.tenant_id, _canon(p.data)]
    if isinstance(p, PeerPayload):
        return DiffKind.PEER, [p.address, p.tenant_id]
    raise TypeError(f"not a diff payload: {type(p).__name__}")


def sign_diff(
    payload: Payload, *, origin: str, seq: int, ts: int, sign: Callable[[bytes], bytes], hops: int = 0, ttl: int = 0
) -> Diff:
    """Encode ``payload`` canonically and sign it as ``origin``."""
    kind, body = _body(payload)
    signed = msgpack.packb([_DIFF_FORMAT, int(kind), id_bytes(origin), seq, ts, body], use_bin_type=True)
    return Diff(kind, origin, seq, ts, payload, signed, sign(signed), hops, ttl)


# -- strict decoding ------------------------------------------------------------------


def _fail(what: str, reason: str = Reason.MALFORMED) -> WireError:
    return WireError(reason, what)


def _str(v: Any, what: str, limit: int, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise _fail(f"{what}: expected a string of at most {limit} characters")
    return v


def _int(v: Any, what: str, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if type(v) is not int or not (-(2**63) <= v < 2**64):
        raise _fail(f"{what}: expected an integer")
    return v


_INT63 = 2**63  # SQLite's integers are signed 64-bit: a seq, hops or ttl must fit one to be logged


def _count(v: Any, what: str) -> int:
    """A seq, hop count or ttl: an integer from 0 to 2^63 - 1."""
    if v.__class__ is not int or not 0 <= v < _INT63:
        raise _fail(f"{what}: expected an integer from 0 to 2^63 - 1")
    return v


def _float(v: Any, what: str, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if type(v) not in (float, int) or v != v or v in (float("inf"), float("-inf")):
        raise _fail(f"{what}: expected a finite number")
    return float(v)


def _bin(v: Any, what: str, size: int | None = None) -> bytes:
    if not isinstance(v, bytes) or (size is not None and len(v) != size):
        raise _fail(f"{what}: expected {size or 'some'} bytes")
    return v


def _list(v: Any, what: str, size: int | None = None) -> list:
    if not isinstance(v, list) or (size is not None and len(v) != size):
        raise _fail(f"{what}: expected an array of {size if size is not None else 'some'} items")
    return v


def _map(v: Any, what: str, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if not isinstance(v, dict):
        raise _fail(f"{what}: expected a map")
    return v


def _vector(v: Any, limits: WireLimits) -> np.ndarray:
    raw = _bin(v, "embedding")
    if len(raw) % 4 or len(raw) // 4 > limits.max_vector_dim:
        raise _fail("embedding: bad length", Reason.CONTENT_TOO_LARGE if len(raw) % 4 == 0 else Reason.MALFORMED)
    vector = np.frombuffer(raw, dtype="<f4")
    if not np.isfinite(vector).all():
        raise _fail("embedding: not finite")
    return vector


def _decode_body(kind: DiffKind, body: list, limits: WireLimits, signed_len: int) -> Payload:
    t = limits.max_text_chars
    if kind is DiffKind.CELL:
        b = _list(body, "cell", 13)
        content = _str(b[3], "content", 4 * limits.max_content_bytes)
        if 4 * len(content) > limits.max_content_bytes and (
            len(content.encode("utf-8", "surrogatepass")) > limits.max_content_bytes
        ):
            raise _fail("content too large", Reason.CONTENT_TOO_LARGE)
        metadata = _map(b[10], "metadata")
        if signed_len > limits.max_metadata_bytes and len(msgpack.packb(metadata)) > limits.max_metadata_bytes:
            raise _fail("metadata too large", Reason.CONTENT_TOO_LARGE)
        payload = CellPayload(
            node_id=_str(b[0], "node_id", t), tenant_id=_str(b[1], "tenant_id", t),
            source_agent=_str(b[2], "source_agent", t), content=content, cell_type=_str(b[4], "cell_type", t),
            salience=_float(b[5], "salience"), created_at=_int(b[6], "created_at"),
            project=_str(b[7], "project", t, True), scene_id=_str(b[8], "scene_id", t, True),
            source_ref=_map(b[9], "source_ref", optional=True), metadata=metadata,
            embedding=_vector(b[11], limits), embedding_space=_str(b[12], "embedding_space", t),
        )  # fmt: skip
        _check_cell_rules(payload)
        return payload
    if kind is DiffKind.TOMBSTONE:
        b = _list(body, "tombstone", 5)
        return TombstonePayload(
            _str(b[0], "cell_id", t), _str(b[1], "tenant_id", t), _count(b[2], "forgotten_at"),
            _str(b[3], "cell_origin", t, True), _count(b[4], "cell_seq"),
        )  # fmt: skip
    if kind is DiffKind.BEACON:
        b = _list(body, "beacon", 12)
        types = b[5]
        if types is not None:
            types = tuple(_str(x, "cell_types", t) for x in _list(types, "cell_types"))
        return BeaconPayload(
            beacon_id=_str(b[0], "beacon_id", t), tenant_id=_str(b[1], "tenant_id", t),
            agent_id=_str(b[2], "agent_id", t), query=_str(b[3], "query", limits.max_content_bytes),
            threshold=_float(b[4], "threshold"), cell_types=types, project=_str(b[6], "project", t, True),
            min_salience=_float(b[7], "min_salience", True), expires_at=_int(b[8], "expires_at", True),
            embedding=_vector(b[9], limits), embedding_space=_str(b[10], "embedding_space", t),
            scope_projects=tuple(_str(x, "scope_projects", t) for x in _list(b[11], "scope_projects")),
        )  # fmt: skip
    if kind is DiffKind.UNBEACON:
        b = _list(body, "unbeacon", 2)
        return UnbeaconPayload(_str(b[0], "beacon_id", t), _str(b[1], "tenant_id", t))
    if kind is DiffKind.SCENE:
        b = _list(body, "scene", 3)
        if signed_len > limits.max_metadata_bytes + limits.max_content_bytes:
            raise _fail("scene too large", Reason.CONTENT_TOO_LARGE)
        return ScenePayload(_str(b[0], "scene_id", t), _str(b[1], "tenant_id", t), _map(b[2], "scene"))
    b = _list(body, "peer", 2)
    return PeerPayload(_str(b[0], "address", t), _str(b[1], "tenant_id", t))


def _check_cell_rules(cell: CellPayload) -> None:
    """The rules local input obeys (:mod:`mesh.cell_rules`), applied to a member's cell."""
    try:
        rules.check_content(cell.content)
        rules.check_cell_type(cell.cell_type)
        rules.check_unit_interval(cell.salience, "salience")
        rules.check_time_ms(cell.created_at, "created_at")
        if cell.project is not None:
            rules.check_text(cell.project, "project")
        rules.check_source_ref(cell.source_ref)
        rules.metadata_json(cell.metadata)
    except CellRuleError as exc:
        raise WireError(exc.reason, f"cell {cell.node_id[:64]!r}: {exc.message}") from None


# -- what decoding may keep --------------------------------------------------------------

# Control diffs (peer records, beacons, beacon removals) reach every member, so a node
# hosting many engines (the simulator) or re-reading its log decodes the same signed bytes
# over and over. Their payloads are immutable (strings, tuples, a read-only vector), so a
# cache keeps the decoded header and payload, keyed by the exact signed bytes and the limits.
_CONTROL_SHAREABLE = frozenset({3, 4, 6})  # BEACON, UNBEACON, PEER (scenes carry a mutable map)
_DATA_SHAREABLE = frozenset({int(DiffKind.CELL), int(DiffKind.TOMBSTONE)})
_DIFFS_KEPT = 100_000
_IDS_KEPT = 200_000
_KEYS_KEPT = 200_000


class DecodeCache:
    """What decoding keeps from one frame to the next, for the one owner that decodes them.

    An engine makes its own unless handed one; a simulator's part hands one to all its engines,
    so that thousands of engines holding one diff hold one copy of it. Not for sharing between
    threads: each owner decodes on one. Everything in it is bounded (cleared when full) and
    decodes exactly as a fresh decoding would: it only lets the objects be shared.

    * ``diffs``: signed bytes -> ``[kind, origin, seq, ts, payload, signed, signature, limits,
      last]``, the first decoding's objects, handed to every later decoding of the same bytes
      under the same limits (one copy of the payload, the signed bytes and the equal
      signature); ``last`` is the last diff made from them, itself handed out again when it
      came with the same routing fields (diffs are immutable). Keyed by the bytes alone:
      hashing the limits too costs more than the rest.
    * ``ids``: raw node id -> hex (a digest names every member, in every gossip frame).
    * ``keys``: public key -> ``(public key, proof)`` as first decoded: every frame carries its
      sender's key, and each engine keeps the members' keys.

    Only control diffs are kept, unless the owner never edits a payload it was handed (a
    cell's holds mutable maps): ``share_data=True`` (a simulator) keeps cells and tombstones
    too, as does a :meth:`share_data_payloads` block while it lasts.
    """

    def __init__(self, *, share_data: bool = False) -> None:
        self.diffs: dict[bytes, list[Any]] = {}
        self.ids: dict[bytes, str] = {}
        self.keys: dict[bytes, tuple[bytes, bytes]] = {}
        self.share_data = share_data
        self.shareable: set[int] = set(_CONTROL_SHAREABLE | (_DATA_SHAREABLE if share_data else set()))
        self._sharing = 0  # share_data_payloads blocks open

    @contextlib.contextmanager
    def share_data_payloads(self) -> Iterator[None]:
        """Within this block, keep decoded cell and tombstone diffs too. Blocks may overlap:
        sharing lasts until the last ends, and then the cells and tombstones kept are let go."""
        self._sharing += 1
        self.shareable.update(_DATA_SHAREABLE)
        try:
            yield
        finally:
            self._sharing -= 1
            if not self._sharing and not self.share_data:
                self.shareable.difference_update(_DATA_SHAREABLE)
                for key in [k for k, v in self.diffs.items() if v[0] in _DATA_SHAREABLE]:
                    del self.diffs[key]

    def key_entry(self, public_key: bytes, proof: bytes) -> tuple[bytes, bytes]:
        """``(public_key, proof)``, the first decoding's when it said the same."""
        keys = self.keys
        known = keys.get(public_key)
        if known is not None and known[1] == proof:
            return known
        if len(keys) > _KEYS_KEPT:
            keys.clear()
        entry = keys[public_key] = (public_key, proof)
        return entry

    def hex_id(self, raw: Any, what: str) -> str:
        """A raw node id (checked) as hex, the one string for it."""
        ids = self.ids
        text = ids.get(raw) if type(raw) is bytes else None
        if text is None:
            text = id_hex(_bin(raw, what))
            if len(ids) > _IDS_KEPT:
                ids.clear()
            ids[raw] = text
        return text


def decode_signed(
    signed: bytes, signature: bytes, hops: int, ttl: int, limits: WireLimits = DEFAULT_LIMITS, *, told: bytes = b"",
    cache: DecodeCache | None = None,
) -> Diff:
    """Decode a diff's signed bytes (not verifying the signature: the engine does)."""
    if told.__class__ is not bytes or told:
        told = _bin(told, "told")
        if len(told) % TOLD_ID_BYTES or len(told) > MAX_TOLD * TOLD_ID_BYTES:
            raise _fail(f"told: {len(told)} bytes")
    known = cache.diffs.get(signed) if cache is not None and type(signed) is bytes else None
    if known is not None and (known[7] is limits or known[7] == limits):
        kind, origin, seq, ts, payload, first_signed, first_signature, _, last = known
        if (
            last.hops == hops and last.ttl == ttl and type(hops) is int and type(ttl) is int
            and last.told == told and last.signature == signature
        ):  # fmt: skip
            return last
        signature = first_signature if signature == first_signature else _bin(signature, "signature", 64)
        diff = Diff(
            kind, origin, seq, ts, payload, first_signed, signature, _count(hops, "hops"), _count(ttl, "ttl"), told
        )
        known[8] = diff
        return diff
    try:
        header = msgpack.unpackb(signed, raw=False, strict_map_key=True, max_bin_len=limits.max_frame_bytes)
        fmt, kind_code, origin, seq, ts, body = _list(header, "diff", 6)
        if fmt != _DIFF_FORMAT:
            raise _fail(f"diff format {fmt!r}", Reason.BAD_VERSION)
        try:
            kind = DiffKind(kind_code)
        except ValueError:
            raise _fail(f"unknown diff kind {kind_code!r}") from None
        payload = _decode_body(kind, body, limits, len(signed))
        diff = Diff(
            kind, id_hex(_bin(origin, "origin")), _count(seq, "seq"), _int(ts, "ts"),
            payload, signed, _bin(signature, "signature", 64), _count(hops, "hops"), _count(ttl, "ttl"), told,
        )  # fmt: skip
    except WireError:
        raise
    except Exception as exc:  # msgpack's many exception types, unpacking, decoding
        raise WireError(Reason.MALFORMED, f"undecodable diff: {type(exc).__name__}") from None
    if diff.seq < 1:
        raise _fail("seq must be positive")
    if cache is not None and kind in cache.shareable and type(signed) is bytes:
        diffs = cache.diffs
        if len(diffs) >= _DIFFS_KEPT:
            diffs.clear()
        diffs[signed] = [kind, diff.origin, diff.seq, diff.ts, payload, signed, diff.signature, limits, diff]
    return diff
