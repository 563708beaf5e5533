"""The codec's decoders bound to one :class:`~mesh.diffs.DecodeCache`, for the tests of what it shares.

The codec keeps nothing between calls: whoever decodes many frames hands it a cache of its own
(an engine; a simulator's part, for all its engines). These tests check what such a cache
shares, so they decode through one, as one long-lived owner would.
"""

from __future__ import annotations

import functools

from mesh.wire import DecodeCache, decode_envelope as _decode_envelope, decode_signed as _decode_signed

__all__ = ["CACHE", "decode_envelope", "decode_signed", "share_data_payloads"]

CACHE = DecodeCache()
decode_envelope = functools.partial(_decode_envelope, cache=CACHE)
decode_signed = functools.partial(_decode_signed, cache=CACHE)
share_data_payloads = CACHE.share_data_payloads
