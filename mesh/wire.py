"""The wire format: the frame envelope and its codec.

An envelope is the plaintext of one frame; the diffs it carries are :mod:`mesh.diffs`'
(signed, canonical), with their routing fields outside the signature::

    diff      = [signed: bin, signature: bin64, hops: int, ttl: int, (told: bin)]
    envelope  = [WIRE_VERSION, type, sent_at, sender_address,
                 keys: {origin(bin16): [public_key(bin32), proof(bin32)]},
                 diffs: [diff...], extra: [...per type]]

``keys`` carries, for every origin in ``diffs`` and for the sender, the public key and
membership proof, so any diff can be checked on arrival. An envelope is sealed by
:mod:`mesh.team` into one frame. :func:`decode_envelope` raises :class:`WireError`
for any malformed input, never another exception type.

Like :mod:`mesh.diffs`, the codec holds no state: a decoder that reads many frames passes
its own :class:`~mesh.diffs.DecodeCache` (the engine does), so the ids, keys and diffs that
every frame repeats are decoded once per owner. The diff types are re-exported here, where
the mesh's callers have always found them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

import msgpack

from .diffs import (
    _ORIGIN_BYTES, CONTROL_KINDS, DATA_KINDS, DEFAULT_LIMITS, DIFF_KEY_BYTES, BeaconPayload, CellPayload,
    DecodeCache, Diff, DiffKind, Payload, PeerPayload, ScenePayload, TombstonePayload, UnbeaconPayload, WireLimits,
    _bin, _fail, _int, _list, _map, _str, decode_signed, diff_key, id_bytes, id_hex, sign_diff,
)  # fmt: skip
from .errors import Reason, WireError
from .haves import MAX_HAVE_BYTES, MAX_HAVE_ORIGINS, HaveSet

__all__ = [
    "WIRE_VERSION", "MsgType", "Envelope", "Digest", "NO_HAVES", "encode_envelope", "decode_envelope",
    # re-exported from mesh.diffs
    "DiffKind", "CONTROL_KINDS", "DATA_KINDS", "WireLimits", "DEFAULT_LIMITS", "CellPayload", "TombstonePayload",
    "BeaconPayload", "UnbeaconPayload", "ScenePayload", "PeerPayload", "Payload", "Diff", "sign_diff",
    "decode_signed", "DecodeCache", "diff_key", "DIFF_KEY_BYTES", "id_bytes", "id_hex",
]  # fmt: skip

WIRE_VERSION = 1


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
    # Decoded with drop_bad_diffs: the reason each diff left out was refused (see decode_envelope).
    rejected: tuple[str, ...] = ()


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
    return {id_bytes(origin): version for origin, version in digest.items()}


def _decode_digest(digest: dict, cache: DecodeCache) -> dict[str, int]:
    hexes = cache.ids
    try:  # every origin seen before (the usual case): one comprehension, then the versions' types
        out = {hexes[raw]: version for raw, version in digest.items()}
    except (KeyError, TypeError):
        pass
    else:
        if set(map(type, out.values())) <= {int}:  # msgpack's integers are all within the range below
            return out
    out = {}
    for raw, version in digest.items():
        origin = cache.hex_id(raw, "digest origin")
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


def decode_envelope(
    data: bytes, limits: WireLimits = DEFAULT_LIMITS, cache: DecodeCache | None = None, *,
    drop_bad_diffs: bool = False,
) -> Envelope:  # fmt: skip
    """Decode and validate one envelope; any problem raises :class:`WireError`. ``cache``:
    the caller's, if it decodes many (without one, this frame's decoding keeps nothing).

    With ``drop_bad_diffs`` (the engine), a diff that does not decode is left out of
    ``diffs`` and its reason put in ``rejected``, and the rest of the frame stands: one
    member's unsound diff, relayed by an honest peer or in a repair reply, must not take
    the others of its batch with it (nor stall a repair that would send it again and
    again). The frame itself must still be sound: its diffs are decoded last, so a frame
    that is malformed elsewhere is refused for that, with or without the flag."""
    if len(data) > limits.max_frame_bytes:
        raise _fail(f"frame of {len(data)} bytes", Reason.OVERSIZED)
    try:
        return _decode_envelope(data, limits, DecodeCache() if cache is None else cache, drop_bad_diffs)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(Reason.MALFORMED, f"undecodable envelope: {type(exc).__name__}") from None


def _decode_envelope(data: bytes, limits: WireLimits, cache: DecodeCache, drop_bad_diffs: bool) -> Envelope:
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
    hexes, key_entry = cache.ids, cache.key_entry
    for origin, entry in _map(raw_keys, "keys").items():
        # Every frame carries its sender's key: check the usual well-formed entry inline.
        if type(entry) is list and len(entry) == 2 and type(origin) is bytes and (text := hexes.get(origin)):
            pk, proof = entry
            if type(pk) is bytes and len(pk) == 32 and type(proof) is bytes and len(proof) == 32:
                keys[text] = key_entry(pk, proof)
                continue
        pk, proof = _list(entry, "key entry", 2)
        keys[cache.hex_id(origin, "key origin")] = key_entry(_bin(pk, "public key", 32), _bin(proof, "proof", 32))
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
            digest = _decode_digest(digest, cache)
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
    sent_at, address = _int(sent_at, "sent_at"), _str(address, "sender_address", limits.max_text_chars)
    if not drop_bad_diffs:
        diffs = tuple(_decode_diff(d, limits, cache) for d in raw_diffs)
        return Envelope(mtype, sent_at, address, keys, diffs, **fields)
    kept: list[Diff] = []
    rejected: list[str] = []
    for raw in raw_diffs:
        try:
            kept.append(_decode_diff(raw, limits, cache))
        except WireError as exc:
            rejected.append(exc.reason)
    return Envelope(mtype, sent_at, address, keys, tuple(kept), **fields, rejected=tuple(rejected))


def _decode_diff(raw: Any, limits: WireLimits, cache: DecodeCache) -> Diff:
    """``[signed, signature, hops, ttl]``, or the same with ``told`` (senders without it omit it)."""
    if not isinstance(raw, list) or len(raw) not in (4, 5):
        raise _fail("diff: expected an array of 4 or 5 items")
    if len(raw) == 4:
        return decode_signed(*raw, limits=limits, cache=cache)
    signed, signature, hops, ttl, told = raw
    return decode_signed(signed, signature, hops, ttl, limits, told=told, cache=cache)


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
