"""Admission: which frames and diffs the engine lets in, as functions of what they are handed.

Every frame is opened (AEAD, :mod:`mesh.team`), decoded strictly (:mod:`mesh.wire`), and
checked for replay and clock skew against its sender's clock (:class:`ReplayWindow`); its
sender must be a member we know or one whose key and proof ride in the frame and check out.
Every diff is then checked for its timestamp, its origin's membership and its signature
(:func:`admit_diff`). A rejection is a *drop reason* (:class:`mesh.errors.Reason`), which the
engine counts in ``counters.drops``; nothing raises out of admission for bad input.

:func:`admit_frame` and :func:`admit_diff` keep no state of their own and read no clock:
``now`` and everything they consult is passed in. What they change is passed in too: the
replay window (a frame let in is remembered, and its sender's clock offset followed) and,
through ``learn_key``, the keyring (a member's key seen for the first time is kept).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

from .diffs import DecodeCache, Diff, WireLimits
from .errors import MeshError, Reason
from .membership import Keyring
from .wire import Envelope, decode_envelope

__all__ = ["ReplayWindow", "admit_frame", "admit_diff", "Verifier", "KeyLearner", "OWN_FRAME"]

Verifier = Callable[[bytes, bytes, bytes], bool]  # (public_key, signature, message)
KeyLearner = Callable[[str, bytes, bytes], bool]  # (origin, public_key, proof): kept if it checks out

OWN_FRAME = ""  # admit_frame's answer to a frame of our own (a loop back): ignored, not counted


class ReplayWindow:
    """The nonces of the frames let in, for as long as a replay of one would pass the age check,
    and each sender's clock offset (its clock minus ours, estimated from its frames)."""

    def __init__(self, max_clock_skew_ms: int, max_future_skew_ms: int, frame_max_age_ms: int) -> None:
        self.max_clock_skew_ms = max_clock_skew_ms
        self.max_future_skew_ms = max_future_skew_ms
        self.frame_max_age_ms = frame_max_age_ms
        self.offsets: dict[str, int] = {}  # sender -> its clock minus ours (ms), estimated
        self._nonces: dict[bytes, int] = {}
        self._order: collections.deque[tuple[int, bytes]] = collections.deque()

    def admit(self, sender_id: str, sent_at: int, nonce: bytes, now: int) -> str | None:
        """Reject frames from the future, frames too old, and frames seen before (the reason);
        None lets the frame in, and remembers it.

        ``sample`` is the sender's clock minus ours, less the transit time. A sender's first
        frame (or one whose clock jumped ahead) is judged against ``max_clock_skew_ms``; then
        its offset is tracked (the highest sample, followed slowly downward), and a frame older
        than ``frame_max_age_ms`` *by the sender's clock* is a replay. So a node 5 minutes
        behind is no replayer, and nonces need keeping for the replay window only.
        """
        sample = sent_at - now
        offset = self.offsets.get(sender_id)
        if offset is None or sample > offset + self.max_future_skew_ms:
            if sample > self.max_clock_skew_ms:
                return Reason.FUTURE
            if sample < -self.max_clock_skew_ms - self.frame_max_age_ms:
                return Reason.REPLAY
            offset = sample
        elif sample < offset - self.frame_max_age_ms:
            return Reason.REPLAY
        if nonce in self._nonces:
            return Reason.REPLAY
        self.offsets[sender_id] = sample if sample > offset else offset + (sample - offset) // 64
        order = self._order
        while order and order[0][0] < now:
            del self._nonces[order.popleft()[1]]
        expires = now + self.frame_max_age_ms + self.max_future_skew_ms
        self._nonces[nonce] = expires
        order.append((max(expires, order[-1][0] if order else expires), nonce))
        return None

    def forget(self, sender_id: str) -> None:
        """Estimate the sender's offset afresh from its next frame (it went dead: it may come
        back with another clock)."""
        self.offsets.pop(sender_id, None)


def admit_frame(
    frame: bytes, now: int, *, self_id: str, sealer: Any, limits: WireLimits, cache: DecodeCache,
    replay: ReplayWindow, keyring: Keyring, learn_key: KeyLearner, self_address: str | None = None,
) -> tuple[str, Envelope] | str:  # fmt: skip
    """``(sender_id, envelope)`` of a frame let in; else why not (a drop reason), or
    :data:`OWN_FRAME` for one of our own. A frame under our id that says it comes from another
    address than ``self_address`` is no loop back: it is handed over as ``(self_id, envelope)``,
    for the engine to refuse and report (:mod:`mesh.identity_guard`)."""
    try:
        sender_id, nonce, plaintext = sealer.open(frame)
        env = decode_envelope(plaintext, limits, cache)
    except MeshError as exc:
        return exc.reason
    if sender_id == self_id:
        if self_address is not None and env.sender_address != self_address:
            return sender_id, env
        return OWN_FRAME
    reason = replay.admit(sender_id, env.sent_at, nonce, now)
    if reason is not None:
        return reason
    if keyring.get(sender_id) is None:
        entry = env.keys.get(sender_id)
        if entry is None or not learn_key(sender_id, *entry):
            return Reason.NOT_MEMBER
    return sender_id, env


def admit_diff(
    diff: Diff, keys: Mapping[str, tuple[bytes, bytes]], now: int, keyring: Keyring, verify: Verifier,
    learn_key: KeyLearner, max_clock_skew_ms: int,
) -> str | None:  # fmt: skip
    """Timestamp, membership and signature of one diff: None if it may be applied, else why not.
    ``keys`` are those its frame carried (an origin not yet in the keyring is learned from them)."""
    if diff.ts > now + max_clock_skew_ms:
        return Reason.FUTURE
    key = keyring.get(diff.origin)
    if key is None:
        entry = keys.get(diff.origin)
        if entry is None:
            return Reason.UNKNOWN_ORIGIN
        if not learn_key(diff.origin, *entry):
            return Reason.NOT_MEMBER
        key = entry
    if not verify(key[0], diff.signature, diff.signed):
        return Reason.BAD_SIGNATURE
    return None
