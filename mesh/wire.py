"""The wire format: diffs, their canonical signed encoding, and the frame envelope.

A **diff** is one signed change by its *origin* node: ``cell``, ``tombstone``,
``beacon``, ``unbeacon``, ``scene`` or ``peer``. Its signed part is the msgpack
encoding of ``[1, kind, origin, seq, ts, body]`` where ``body`` is a fixed-order array
per kind (maps inside bodies are key-sorted), so the encoding is canonical by
construction. The signed bytes travel as they were signed: relays forward them
untouched and receivers verify them before decoding a field of trust. Only the
routing fields, ``hops``, remaining ``ttl`` and (partial view, optional) the nodes
already sent the diff (:mod:`mesh.told`), sit outside the signature::

    diff      = [signed: bin, signature: bin64, hops: int, ttl: int, (told: bin)]
    envelope  = [WIRE_VERSION, type, sent_at, sender_address,
                 keys: {origin(bin16): [public_key(bin32), proof(bin32)]},
                 diffs: [diff...], extra: [...per type]]

``keys`` carries, for every origin in ``diffs`` and for the sender, the public key and
membership proof, so any diff can be checked on arrival. An envelope is sealed by
:mod:`mesh.team` into one frame. :func:`decode_envelope` raises :class:`WireError`
for any malformed input, never another exception type.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Union

import msgpack
import numpy as np

from .errors import Reason, WireError
from .haves import MAX_HAVE_BYTES, MAX_HAVE_ORIGINS, HaveSet
from .told import MAX_TOLD, TOLD_ID_BYTES

__all__ = [
    "WIRE_VERSION",
    "DiffKind",
    "MsgType",
    "WireLimits",
    "CellPayload",
    "TombstonePayload",
    "BeaconPayload",
    "UnbeaconPayload",
    "ScenePayload",
    "PeerPayload",
    "Payload",
    "Diff",
    "Envelope",
    "sign_diff",
    "diff_key",
    "decode_signed",
    "share_data_payloads",
    "encode_envelope",
    "decode_envelope",
    "CONTROL_KINDS",
    "DATA_KINDS",
    "Digest",
]

WIRE_VERSION = 1
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


class MsgType(enum.IntEnum):
    # pushed data diffs; extra [batch_id], [batch_id, [acked batch_id...]], [..., prune] or
    # [..., prune, [[origin, seq]...]] (announcements riding, see IHAVE)
    DATA = 1
    ACK = 2  # extra [[batch_id...]], [[batch_id...], prune] or [..., prune, [[origin, seq]...]]
    GOSSIP = 3  # anti-entropy; extra [digest | nil, reply_wanted]
    REPAIR_REQUEST = 4  # extra [request_id, since, limit, requester_version]
    REPAIR_REPLY = 5  # extra [request_id, upto, more, ready]
    PING = 6  # extra [nonce]
    PONG = 7  # extra [nonce]
    IHAVE = 8  # lazy push (mesh.lazy): diffs the sender holds; extra [[[origin, seq]...]]
    GRAFT = 9  # lazy push: send me these announced diffs; extra [[[origin, seq]...]]


@dataclasses.dataclass(frozen=True)
class WireLimits:
    max_frame_bytes: int = 4 * 1024 * 1024
    max_diffs: int = 256
    max_content_bytes: int = 64 * 1024
    max_metadata_bytes: int = 16 * 1024
    max_vector_dim: int = 4096
    max_digest_entries: int = 100_000
    max_text_chars: int = 4096  # ids, names, queries, addresses


DEFAULT_LIMITS = WireLimits()


# Node ids are hex in memory and 16 raw bytes on the wire; digests carry one per member,
# so both directions are memoised.
_ID_BYTES: dict[str, bytes] = {}
_ID_HEX: dict[bytes, str] = {}


def id_bytes(node_id: str) -> bytes:
    raw = _ID_BYTES.get(node_id)
    if raw is None:
        if len(_ID_BYTES) > 200_000:
            _ID_BYTES.clear()
        raw = _ID_BYTES[node_id] = bytes.fromhex(node_id)
    return raw


def id_hex(raw: bytes) -> str:
    text = _ID_HEX.get(raw)
    if text is None:
        if len(raw) != _ORIGIN_BYTES:
            raise _fail("node id: expected 16 bytes")
        if len(_ID_HEX) > 200_000:
            _ID_HEX.clear()
        text = _ID_HEX[raw] = raw.hex()
    return text


DIFF_KEY_BYTES = 12


def diff_key(origin: str, seq: int) -> bytes:
    """A compact name for ``(origin, seq)``: 8 bytes of the origin, 4 of the seq."""
    return id_bytes(origin)[:8] + (seq & 0xFFFFFFFF).to_bytes(4, "big")


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
        salience = _float(b[5], "salience")
        if not 0.0 <= salience <= 1.0:
            raise _fail("salience outside [0, 1]")
        source_ref = _map(b[9], "source_ref", optional=True)
        return CellPayload(
            node_id=_str(b[0], "node_id", t), tenant_id=_str(b[1], "tenant_id", t),
            source_agent=_str(b[2], "source_agent", t), content=content, cell_type=_str(b[4], "cell_type", t),
            salience=salience, created_at=_int(b[6], "created_at"), project=_str(b[7], "project", t, True),
            scene_id=_str(b[8], "scene_id", t, True), source_ref=source_ref, metadata=metadata,
            embedding=_vector(b[11], limits), embedding_space=_str(b[12], "embedding_space", t),
        )  # fmt: skip
    if kind is DiffKind.TOMBSTONE:
        b = _list(body, "tombstone", 5)
        return TombstonePayload(
            _str(b[0], "cell_id", t), _str(b[1], "tenant_id", t), _int(b[2], "forgotten_at"),
            _str(b[3], "cell_origin", t, True), _int(b[4], "cell_seq"),
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


# Control diffs (peer records, beacons, beacon removals) reach every member, so a node
# hosting many engines (the simulator) or re-reading its log decodes the same signed bytes
# over and over. Their payloads are immutable (strings, tuples, a read-only vector), so the
# decoded header and payload are kept, keyed by the exact signed bytes and the limits.
_SHAREABLE_KINDS = {3, 4, 6}  # BEACON, UNBEACON, PEER (scenes carry a mutable map)
# signed -> [kind, origin, seq, ts, payload, signed, signature, limits, last]: the first
# decode's objects, handed to every later decode of the same bytes under the same limits, so
# the many engines of a simulator that hold one diff hold one copy of its payload, signed bytes
# and (equal) signature; ``last`` is the last diff made from them, itself handed out again when
# it came with the same routing fields (diffs are immutable). Keyed by the bytes alone: hashing
# the limits too costs more than the rest.
_DECODED: dict[bytes, list[Any]] = {}
_DECODED_MAX = 100_000


@contextlib.contextmanager
def share_data_payloads() -> Iterator[None]:
    """Within this block, keep decoded cell and tombstone diffs too (a simulator's opt-in).

    A simulator relays one cell diff between thousands of engines in one process, and each
    of them decodes the same signed bytes. A cell's payload holds mutable maps (metadata,
    source_ref), so sharing it is safe only where nothing edits a payload it was handed:
    the simulator, not a node whose store may.
    """
    global _SHARING
    data = {int(DiffKind.CELL), int(DiffKind.TOMBSTONE)}
    with _SHARING_LOCK:  # blocks may overlap (a sweep's runs on one worker's threads)
        _SHARING += 1
        _SHAREABLE_KINDS.update(data)
    try:
        yield
    finally:
        with _SHARING_LOCK:
            _SHARING -= 1
            if not _SHARING:
                _SHAREABLE_KINDS.difference_update(data)
                # a snapshot: another thread's engines may be decoding (adding) meanwhile
                for key in [k for k, v in list(_DECODED.items()) if v[0] in data]:
                    _DECODED.pop(key, None)


_SHARING = 0  # share_data_payloads blocks open
_SHARING_LOCK = threading.Lock()


def decode_signed(
    signed: bytes, signature: bytes, hops: int, ttl: int, limits: WireLimits = DEFAULT_LIMITS, *, told: bytes = b""
) -> Diff:
    """Decode a diff's signed bytes (not verifying the signature: the engine does)."""
    if told.__class__ is not bytes or told:
        told = _bin(told, "told")
        if len(told) % TOLD_ID_BYTES or len(told) > MAX_TOLD * TOLD_ID_BYTES:
            raise _fail(f"told: {len(told)} bytes")
    known = _DECODED.get(signed) if type(signed) is bytes else None
    if known is not None and (known[7] is limits or known[7] == limits):
        kind, origin, seq, ts, payload, first_signed, first_signature, _, last = known
        if (
            last.hops == hops and last.ttl == ttl and type(hops) is int and type(ttl) is int
            and last.told == told and last.signature == signature
        ):  # fmt: skip
            return last
        signature = first_signature if signature == first_signature else _bin(signature, "signature", 64)
        diff = Diff(
            kind, origin, seq, ts, payload, first_signed, signature, _int(hops, "hops"), _int(ttl, "ttl"), told
        )
        if diff.hops < 0 or diff.ttl < 0:
            raise _fail("seq, hops and ttl must be positive")
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
            kind, id_hex(_bin(origin, "origin")), _int(seq, "seq"), _int(ts, "ts"),
            payload, signed, _bin(signature, "signature", 64), _int(hops, "hops"), _int(ttl, "ttl"), told,
        )  # fmt: skip
    except WireError:
        raise
    except Exception as exc:  # msgpack's many exception types, unpacking, decoding
        raise WireError(Reason.MALFORMED, f"undecodable diff: {type(exc).__name__}") from None
    if diff.seq < 1 or diff.hops < 0 or diff.ttl < 0:
        raise _fail("seq, hops and ttl must be positive")
    if kind in _SHAREABLE_KINDS and type(signed) is bytes:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        _DECODED[signed] = [kind, diff.origin, diff.seq, diff.ts, payload, signed, diff.signature, limits, diff]
    return diff


# -- envelopes ------------------------------------------------------------------------


NO_HAVES = HaveSet()  # a frame that is no repair request holds none: every envelope shares this one


# Not frozen, unlike the diffs it carries: one is made for every frame sent and every frame
# received and dropped once handled, and a frozen dataclass's constructor costs ~7x a plain
# one's (two per frame, ~4 us of ~50). Nothing changes an envelope once made.
@dataclasses.dataclass(slots=True)
class Envelope:
    """The plaintext of one frame. Fields beyond ``diffs`` are used per ``type``."""

    type: MsgType
    sent_at: int
    sender_address: str
    keys: Mapping[str, tuple[bytes, bytes]] = dataclasses.field(default_factory=dict)
    diffs: tuple[Diff, ...] = ()
    batch_id: int = 0  # DATA
    acks: tuple[int, ...] = ()  # ACK, and DATA: acks riding on a data frame
    # ACK, and DATA with acks: the sender got a copy it held from us: announce to it instead
    # (mesh.lazy). Encoded only when set, so a frame without it is the same bytes as before.
    prune: bool = False
    # IHAVE / GRAFT: (origin, seq) of the diffs named; ACK and DATA: announcements riding
    refs: tuple[tuple[str, int], ...] = ()
    digest: Mapping[str, int] | None = None  # GOSSIP
    reply_wanted: bool = False  # GOSSIP
    request_id: int = 0  # REPAIR_*
    since: int = 0  # REPAIR_REQUEST: the responder's log position already covered
    limit: int = 0  # REPAIR_REQUEST
    version: int = 0  # REPAIR_REQUEST: requester's own control version
    haves: HaveSet = dataclasses.field(default_factory=lambda: NO_HAVES)  # REPAIR_REQUEST: what the requester holds
    upto: int = 0  # REPAIR_REPLY: log position covered by this reply
    more: bool = False  # REPAIR_REPLY
    ready: bool = True  # REPAIR_REPLY: false when the responder lacks the requester's beacons
    nonce: int = 0  # PING / PONG


# A digest names every member (full view), in every gossip frame: its codec is a tight loop
# over the memoised id conversions rather than a call per entry, and a :class:`Digest` from
# the control state comes with its wire form already made.


class Digest(dict):
    """A digest (origin -> version) that also holds its wire form (raw id -> version, same
    order), kept in step by whoever builds it: encoding it is then a copy, not a loop."""

    __slots__ = ("wire",)

    def __init__(self, versions: Mapping[str, int], wire: Mapping[bytes, int]) -> None:
        super().__init__(versions)
        self.wire = dict(wire)


def _encode_digest(digest: Mapping[str, int]) -> dict[bytes, int]:
    if type(digest) is Digest:
        return digest.wire
    raw = _ID_BYTES
    return {raw.get(origin) or id_bytes(origin): version for origin, version in digest.items()}


def _decode_digest(digest: dict) -> dict[str, int]:
    hexes = _ID_HEX
    try:  # every origin seen before (the usual case): one comprehension, then the versions' types
        out = {hexes[raw]: version for raw, version in digest.items()}
    except (KeyError, TypeError):
        pass
    else:
        if set(map(type, out.values())) <= {int}:  # msgpack's integers are all within the range below
            return out
    out = {}
    for raw, version in digest.items():
        origin = hexes.get(raw) if type(raw) is bytes else None
        if origin is None:
            origin = id_hex(_bin(raw, "digest origin"))
        if type(version) is not int or not (-(2**63) <= version < 2**64):
            raise _fail("version: expected an integer")
        out[origin] = version
    return out


def _extra(env: Envelope) -> list[Any]:
    t = env.type
    if t is MsgType.DATA:
        if env.prune or env.refs:
            return [env.batch_id, list(env.acks), *_lazy_extra(env)]
        return [env.batch_id, list(env.acks)] if env.acks else [env.batch_id]
    if t is MsgType.ACK:
        return [list(env.acks), *_lazy_extra(env)] if env.prune or env.refs else [list(env.acks)]
    if t is MsgType.IHAVE or t is MsgType.GRAFT:
        return [_encode_refs(env.refs)]
    if t is MsgType.GOSSIP:
        digest = None if env.digest is None else _encode_digest(env.digest)
        return [digest, env.reply_wanted]
    if t is MsgType.REPAIR_REQUEST:
        haves = [[id_bytes(origin), base, bitmap] for origin, (base, bitmap) in env.haves.spans.items()]
        return [env.request_id, env.since, env.limit, env.version, haves]
    if t is MsgType.REPAIR_REPLY:
        return [env.request_id, env.upto, env.more, env.ready]
    return [env.nonce]


def _encode_refs(refs: tuple[tuple[str, int], ...]) -> list[list[Any]]:
    return [[id_bytes(origin), seq] for origin, seq in refs]


def _lazy_extra(env: Envelope) -> list[Any]:
    """An ack's lazy-push tail: the prune flag, then the announcements riding, if any."""
    return [env.prune, _encode_refs(env.refs)] if env.refs else [env.prune]


def encode_envelope(env: Envelope) -> bytes:
    keys = {id_bytes(origin): [pk, proof] for origin, (pk, proof) in env.keys.items()}
    diffs = [
        [d.signed, d.signature, d.hops, d.ttl, d.told] if d.told else [d.signed, d.signature, d.hops, d.ttl]
        for d in env.diffs
    ]
    return msgpack.packb(
        [WIRE_VERSION, int(env.type), env.sent_at, env.sender_address, keys, diffs, _extra(env)], use_bin_type=True
    )


def decode_envelope(data: bytes, limits: WireLimits = DEFAULT_LIMITS) -> Envelope:
    """Decode and validate one envelope; any problem raises :class:`WireError`."""
    if len(data) > limits.max_frame_bytes:
        raise _fail(f"frame of {len(data)} bytes", Reason.OVERSIZED)
    try:
        return _decode_envelope(data, limits)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(Reason.MALFORMED, f"undecodable envelope: {type(exc).__name__}") from None


def _decode_envelope(data: bytes, limits: WireLimits) -> Envelope:
    top = msgpack.unpackb(
        data, raw=False, strict_map_key=False, max_bin_len=limits.max_frame_bytes,
        max_str_len=limits.max_frame_bytes, max_array_len=max(limits.max_diffs, 64) * 4,
        max_map_len=max(limits.max_digest_entries, limits.max_diffs * 2),
    )  # fmt: skip
    if isinstance(top, list) and top and top[0] != WIRE_VERSION:
        raise _fail(f"wire version {top[0]!r}", Reason.BAD_VERSION)
    _, type_code, sent_at, address, raw_keys, raw_diffs, extra = _list(top, "envelope", 7)
    try:
        mtype = MsgType(type_code)
    except ValueError:
        raise _fail(f"unknown message type {type_code!r}") from None
    raw_diffs = _list(raw_diffs, "diffs")
    if len(raw_diffs) > limits.max_diffs:
        raise _fail(f"{len(raw_diffs)} diffs in one batch", Reason.TOO_MANY_DIFFS)
    keys: dict[str, tuple[bytes, bytes]] = {}
    hexes = _ID_HEX
    for origin, entry in _map(raw_keys, "keys").items():
        # Every frame carries its sender's key: check the usual well-formed entry inline.
        if type(entry) is list and len(entry) == 2 and type(origin) is bytes and (text := hexes.get(origin)):
            pk, proof = entry
            if type(pk) is bytes and len(pk) == 32 and type(proof) is bytes and len(proof) == 32:
                keys[text] = _key_entry(pk, proof)
                continue
        pk, proof = _list(entry, "key entry", 2)
        keys[id_hex(_bin(origin, "key origin"))] = _key_entry(_bin(pk, "public key", 32), _bin(proof, "proof", 32))
    diffs = tuple(_decode_diff(d, limits) for d in raw_diffs)
    fields: dict[str, Any] = {}
    extra = _list(extra, "extra")
    if mtype is MsgType.DATA:
        data = _list(extra, "data")
        if not 1 <= len(data) <= 4:
            raise _fail("data: expected [batch_id], [batch_id, acks], [batch_id, acks, prune] or [..., prune, refs]")
        fields["batch_id"] = _int(data[0], "batch_id")
        if len(data) >= 2:
            fields["acks"] = _decode_acks(data[1], limits)
        _decode_lazy_extra(data[2:], "data", fields, limits)
    elif mtype is MsgType.ACK:
        if not 1 <= len(extra) <= 3:
            raise _fail("ack: expected [acks], [acks, prune] or [acks, prune, refs]")
        fields["acks"] = _decode_acks(extra[0], limits)
        _decode_lazy_extra(extra[1:], "ack", fields, limits)
    elif mtype is MsgType.IHAVE or mtype is MsgType.GRAFT:
        what = "ihave" if mtype is MsgType.IHAVE else "graft"
        fields["refs"] = _decode_refs(_list(extra, what, 1)[0], what, limits)
    elif mtype is MsgType.GOSSIP:
        digest, reply_wanted = _list(extra, "gossip", 2)
        if digest is not None:
            digest = _map(digest, "digest")
            if len(digest) > limits.max_digest_entries:
                raise _fail("digest too large", Reason.OVERSIZED)
            digest = _decode_digest(digest)
        fields["digest"], fields["reply_wanted"] = digest, _bool(reply_wanted)
    elif mtype is MsgType.REPAIR_REQUEST:
        r = _list(extra, "repair request", 5)
        fields.update(request_id=_int(r[0], "id"), since=_int(r[1], "since"), limit=_int(r[2], "limit"),
                      version=_int(r[3], "version"), haves=_decode_haves(r[4]))  # fmt: skip
    elif mtype is MsgType.REPAIR_REPLY:
        r = _list(extra, "repair reply", 4)
        fields.update(request_id=_int(r[0], "id"), upto=_int(r[1], "upto"), more=_bool(r[2]), ready=_bool(r[3]))
    else:
        fields["nonce"] = _int(_list(extra, "ping", 1)[0], "nonce")
    return Envelope(
        mtype, _int(sent_at, "sent_at"), _str(address, "sender_address", limits.max_text_chars), keys, diffs, **fields
    )


# public key -> (public key, proof) as first decoded: every frame carries its sender's key, and
# each engine keeps the members' keys, so a simulator's engines share one copy of each.
_KEY_ENTRIES: dict[bytes, tuple[bytes, bytes]] = {}


def _key_entry(public_key: bytes, proof: bytes) -> tuple[bytes, bytes]:
    known = _KEY_ENTRIES.get(public_key)
    if known is not None and known[1] == proof:
        return known
    if len(_KEY_ENTRIES) > 200_000:
        _KEY_ENTRIES.clear()
    entry = _KEY_ENTRIES[public_key] = (public_key, proof)
    return entry


def _decode_diff(raw: Any, limits: WireLimits) -> Diff:
    """``[signed, signature, hops, ttl]``, or the same with ``told`` (senders without it omit it)."""
    if not isinstance(raw, list) or len(raw) not in (4, 5):
        raise _fail("diff: expected an array of 4 or 5 items")
    if len(raw) == 4:
        return decode_signed(*raw, limits=limits)
    signed, signature, hops, ttl, told = raw
    return decode_signed(signed, signature, hops, ttl, limits, told=told)


def _decode_acks(raw: Any, limits: WireLimits) -> tuple[int, ...]:
    acks = _list(raw, "acks")
    if len(acks) > limits.max_diffs:
        raise _fail("too many acks", Reason.TOO_MANY_DIFFS)
    return tuple(_int(a, "ack") for a in acks)


def _decode_haves(raw: Any) -> HaveSet:
    entries = _list(raw, "haves")
    if len(entries) > MAX_HAVE_ORIGINS:
        raise _fail("haves: too many origins", Reason.OVERSIZED)
    spans: dict[str, tuple[int, bytes]] = {}
    size = 0
    for entry in entries:
        origin, base, bitmap = _list(entry, "haves entry", 3)
        base, bitmap = _int(base, "haves base"), _bin(bitmap, "haves bitmap")
        size += len(bitmap)
        if base < 0 or size > MAX_HAVE_BYTES:
            raise _fail("haves: bad span", Reason.OVERSIZED)
        spans[id_hex(_bin(origin, "haves origin"))] = (base, bitmap)
    return HaveSet(spans)


def _decode_lazy_extra(tail: list, what: str, fields: dict[str, Any], limits: WireLimits) -> None:
    """An ack's optional ``[prune(, refs)]`` (see :func:`_lazy_extra`)."""
    if tail:
        fields["prune"] = tail[0] if type(tail[0]) is bool else _bool(tail[0], f"{what} prune")
    if len(tail) == 2:
        fields["refs"] = _decode_refs(tail[1], f"{what} announcements", limits)


def _decode_refs(raw: Any, what: str, limits: WireLimits) -> tuple[tuple[str, int], ...]:
    """An IHAVE's or GRAFT's ``[[origin, seq]...]``: one to ``max_diffs`` diffs, each named once."""
    entries = _list(raw, f"{what} diffs")
    if not entries:
        raise _fail(f"{what}: names no diff")
    if len(entries) > limits.max_diffs:
        raise _fail(f"{what}: {len(entries)} diffs named", Reason.TOO_MANY_DIFFS)
    refs = []
    for entry in entries:
        # The usual well-formed entry checked inline (no error text made for it).
        if type(entry) is list and len(entry) == 2:
            origin, seq = entry
            if type(seq) is int and 1 <= seq < 2**64 and type(origin) is bytes and len(origin) == _ORIGIN_BYTES:
                refs.append((id_hex(origin), seq))
                continue
        origin, seq = _list(entry, f"{what} entry", 2)
        seq = _int(seq, f"{what} seq")
        if seq < 1:
            raise _fail(f"{what} seq: must be positive")
        refs.append((id_hex(_bin(origin, f"{what} origin", _ORIGIN_BYTES)), seq))
    if len(set(refs)) < len(refs):
        raise _fail(f"{what}: a diff named twice")
    return tuple(refs)


def _bool(v: Any, what: str = "") -> bool:
    if not isinstance(v, bool):
        raise _fail(f"{what}: expected a boolean" if what else "expected a boolean")
    return v
