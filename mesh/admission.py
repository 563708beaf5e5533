"""Admission: which frames and diffs the engine lets in, as functions of what they are handed.

Every frame is opened (AEAD, :mod:`mesh.team`) and decoded strictly (:mod:`mesh.wire`); its
sender must be a member we know or one whose key and proof ride in the frame and check out,
and its sender tag must be that member's (:mod:`mesh.frame_auth`): the team key alone says
only that *some* member sealed it. Only then is it checked for replay and clock skew against
its sender's clock (:class:`ReplayWindow`), so no frame sealed in another's name moves the
estimate of that member's clock. A diff that does not decode (malformed, or a cell that
breaks the cell rules) is one counted drop of its own, and the frame's other diffs go on
(``drop``).
Every diff is then checked for its timestamp, its origin's membership and its signature
(:func:`admit_diff`). A rejection is a *drop reason* (:class:`mesh.errors.Reason`), which the
engine counts in ``counters.drops``; nothing raises out of admission for bad input.

:func:`admit_frame` and :func:`admit_diff` keep no state of their own and read no clock:
``now`` and everything they consult is passed in. What they change is passed in too: the
replay window (a frame let in is remembered, and its sender's clock offset followed) and,
through ``learn_key``, the keyring (a member's key seen for the first time is kept).
"""

from __future__ import annotations

import array
import collections
from collections.abc import Callable, Mapping
from typing import Any

from .diffs import DecodeCache, Diff, WireLimits
from .errors import MeshError, Reason
from .frame_auth import SenderBinding
from .membership import Keyring
from .wire import Envelope, decode_envelope

__all__ = ["ReplayWindow", "admit_frame", "admit_diff", "Verifier", "KeyLearner", "OWN_FRAME"]

Verifier = Callable[[bytes, bytes, bytes], bool]  # (public_key, signature, message)
KeyLearner = Callable[[str, bytes, bytes], bool]  # (origin, public_key, proof): kept if it checks out

OWN_FRAME = ""  # admit_frame's answer to a frame of our own (a loop back): ignored, not counted


class ReplayWindow:
    """The nonces of the frames let in, for as long as a replay of one would pass the age check,
    and each sender's clock offset (its clock minus ours, estimated from its frames)."""

    def __init__(
        self, max_clock_skew_ms: int, max_future_skew_ms: int, frame_max_age_ms: int, *,
        offset_samples: int = 9, offset_step_ms: int = 5_000,
    ) -> None:  # fmt: skip
        self.max_clock_skew_ms = max_clock_skew_ms
        self.max_future_skew_ms = max_future_skew_ms
        self.frame_max_age_ms = frame_max_age_ms
        self.offset_samples = offset_samples
        self.offset_step_ms = offset_step_ms
        self.offsets: dict[str, int] = {}  # sender -> its clock minus ours (ms), estimated
        self._samples: dict[str, array.array] = {}  # sender -> its last samples (compact: one per member)
        self._nonces: dict[bytes, int] = {}
        self._order: collections.deque[tuple[int, bytes]] = collections.deque()

    def admit(self, sender_id: str, sent_at: int, nonce: bytes, now: int) -> str | None:
        """Reject frames from the future, frames too old, and frames seen before (the reason);
        None lets the frame in, and remembers it.

        ``sample`` is the sender's clock minus ours, less the transit time. A sender's first
        frame (or one whose clock jumped ahead) is judged against ``max_clock_skew_ms``; then
        its offset is tracked, and a frame older than ``frame_max_age_ms`` *by the sender's
        clock* is a replay. So a node 5 minutes behind is no replayer, and nonces need keeping
        for the replay window only. The estimate is the median of the sender's last
        ``offset_samples`` samples, approached by at most ``offset_step_ms`` per frame: one
        wild sample (a clock that jumps and jumps back) cannot make its sender's frames replays.
        """
        sample = sent_at - now
        offset = self.offsets.get(sender_id)
        if offset is None or sample > offset + self.max_future_skew_ms:
            if sample > self.max_clock_skew_ms:
                return Reason.FUTURE
            if sample < -self.max_clock_skew_ms - self.frame_max_age_ms:
                return Reason.REPLAY
        elif sample < offset - self.frame_max_age_ms:
            return Reason.REPLAY
        if nonce in self._nonces:
            return Reason.REPLAY
        offset = self._follow(sender_id, sample, offset)
        order = self._order
        while order and order[0][0] < now:
            del self._nonces[order.popleft()[1]]
        # Kept while a replay would pass the age check: longer for a frame ahead of the estimate
        # (a clock that jumped ahead, not yet followed).
        expires = now + self.frame_max_age_ms + max(self.max_future_skew_ms, sample - offset)
        self._nonces[nonce] = expires
        order.append((max(expires, order[-1][0] if order else expires), nonce))
        return None

    def _follow(self, sender_id: str, sample: int, offset: int | None) -> int:
        """Add a sample of a frame let in (within +-(skew + age): an int64); returns the sender's
        new offset estimate."""
        samples = self._samples.get(sender_id)
        if offset is None or samples is None:
            self._samples[sender_id] = array.array("q", (sample,))
            self.offsets[sender_id] = sample
            return sample
        samples.append(sample)
        if len(samples) > self.offset_samples:
            del samples[0]
        ordered = sorted(samples)
        median = ordered[(len(ordered) - 1) // 2]
        step = self.offset_step_ms
        offset += max(-step, min(step, median - offset))
        self.offsets[sender_id] = offset
        return offset

    def forget(self, sender_id: str) -> None:
        """Estimate the sender's offset afresh from its next frame (it went dead: it may come
        back with another clock)."""
        self.offsets.pop(sender_id, None)
        self._samples.pop(sender_id, None)


def admit_frame(
    frame: bytes, now: int, *, self_id: str, sealer: Any, limits: WireLimits, cache: DecodeCache,
    replay: ReplayWindow, keyring: Keyring, learn_key: KeyLearner, binding: SenderBinding,
    drop: Callable[[str], None] | None = None, self_address: str | None = None,
) -> tuple[str, Envelope] | str:  # fmt: skip
    """``(sender_id, envelope)`` of a frame let in; else why not (a drop reason), or
    :data:`OWN_FRAME` for one of our own. A frame under our id that says it comes from another
    address than ``self_address`` is no loop back: it is handed over as ``(self_id, envelope)``,
    for the engine to refuse and report (:mod:`mesh.identity_guard`).

    With ``drop`` (the engine's drop counter), a diff of the frame that does not decode is
    counted there under its reason and left out, and the rest of the frame is judged as
    usual (see :func:`mesh.wire.decode_envelope`); without it, such a diff refuses the frame."""
    try:
        opened = sealer.unseal(frame)
        env = decode_envelope(opened.plaintext, limits, cache, drop_bad_diffs=drop is not None)
    except MeshError as exc:
        return exc.reason
    for reason in env.rejected:  # diffs that did not decode: one drop each, the frame goes on
        drop(reason)  # type: ignore[misc]
    sender_id = opened.sender_id
    if sender_id == self_id:
        if self_address is not None and env.sender_address != self_address:
            return sender_id, env
        return OWN_FRAME
    key = keyring.get(sender_id)
    if key is None:
        key = env.keys.get(sender_id)
        if key is None or not learn_key(sender_id, *key):
            return Reason.NOT_MEMBER
    if not binding.vouches(opened, key[0]):
        return Reason.BAD_FRAME_AUTH
    reason = replay.admit(sender_id, env.sent_at, opened.nonce, now)
    if reason is not None:
        return reason
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
