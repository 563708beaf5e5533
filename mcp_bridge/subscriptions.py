"""Inbox subscriptions over stdio: ``resources/subscribe`` to ``hyphae://inbox``, answered with
``notifications/resources/updated`` when something new arrives there.

Only a transport that can speak first can notify. MCP over HTTP here is stateless (no
session, no SSE stream), so the daemon's ``initialize`` says ``subscribe: false``; stdio is
a standing pipe, so :func:`mcp_bridge.stdio.serve_stdio` wraps its handle in
:class:`InboxWatch`, which

- marks ``resources.subscribe`` true in the ``initialize`` answer it relays;
- answers ``resources/subscribe`` / ``resources/unsubscribe`` for ``hyphae://inbox`` itself
  (any other uri: -32602; nothing else can change without a new cell, which has a new uri);
- while subscribed, asks the inbox every ``poll_seconds`` for diffs received since the last
  look (the ``inbox`` tool through the same handle, so the same key, scope and daemon), and
  writes one ``notifications/resources/updated`` for ``hyphae://inbox`` when there are any.

Polling is the daemon's side of the bargain kept simple: one indexed read per interval per
subscribed session, and no new channel between the daemon and the relay. The first look
starts at the moment of subscribing (``clock``, ms since the epoch): what was already in the
inbox is the host's to read, not news.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from . import jsonrpc
from .errors import reason_error
from .resources import INBOX_URI

__all__ = ["POLL_SECONDS", "InboxWatch"]

logger = logging.getLogger(__name__)

POLL_SECONDS = 2.0
_PAGE = 500  # diffs per look: one look sees a burst whole

Handle = Callable[[bytes], Awaitable["bytes | None"]]
Write = Callable[[bytes], Awaitable[None]]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class InboxWatch:
    """A stdio ``handle`` that adds inbox subscriptions to the ``handle`` it wraps."""

    def __init__(self, handle: Handle, *, poll_seconds: float = POLL_SECONDS,
                 clock: Callable[[], int] = _wall_clock_ms) -> None:
        self._handle = handle
        self._poll_seconds = poll_seconds
        self._clock = clock
        self._since: int | None = None  # None: not subscribed
        self._subscribed = trio.Event()
        self._looks = 0

    @property
    def subscribed(self) -> bool:
        return self._since is not None

    async def __call__(self, line: bytes) -> bytes | None:
        event = jsonrpc.parse(line)
        if isinstance(event, jsonrpc.RequestReceived) and event.method in ("resources/subscribe",
                                                                           "resources/unsubscribe"):
            return jsonrpc.encode(self._subscription(event))
        response = await self._handle(line)
        if isinstance(event, jsonrpc.RequestReceived) and event.method == "initialize" and response:
            return _say_subscribe(response)
        return response

    def _subscription(self, request: jsonrpc.RequestReceived) -> dict[str, Any]:
        uri = request.params.get("uri") if isinstance(request.params, dict) else None
        if uri != INBOX_URI:
            error = reason_error("invalid_argument", f"{request.method}: only {INBOX_URI} can be subscribed to; "
                                 f"got {uri!r}", field="uri")
            return jsonrpc.failure(request.id, error)
        if request.method == "resources/unsubscribe":
            self._since = None
            self._subscribed = trio.Event()
        elif self._since is None:
            self._since = self._clock()
            self._subscribed.set()
        return jsonrpc.success(request.id, {})

    async def serve_notifications(self, write: Write) -> None:
        """Poll while subscribed and write a notification per look that finds news; runs until
        cancelled (``serve_stdio`` cancels it when the host goes away)."""
        while True:
            await self._subscribed.wait()
            await trio.sleep(self._poll_seconds)
            since = self._since
            if since is None:
                continue
            news, next_since = await self._look(since)
            if self._since != since:
                continue  # unsubscribed (or subscribed anew) while looking
            self._since = max(since, next_since)
            if news:
                notification = {"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                "params": {"uri": INBOX_URI}}
                await write(jsonrpc.encode(notification))

    async def _look(self, since: int) -> tuple[bool, int]:
        """Whether diffs arrived after ``since``, and the time to look from next."""
        self._looks += 1
        call = {"jsonrpc": "2.0", "id": f"hyphae-inbox-watch-{self._looks}", "method": "tools/call",
                "params": {"name": "inbox", "arguments": {"since": since, "limit": _PAGE}}}
        try:
            answer = await self._handle(jsonrpc.encode(call))
            result = json.loads(answer)["result"]["structuredContent"] if answer else None
        except (ValueError, KeyError, TypeError):
            result = None
        except Exception:  # the daemon went away mid-look: try again next interval
            logger.exception("looking at the inbox for a subscription failed")
            result = None
        if not isinstance(result, dict) or not isinstance(result.get("diffs"), list):
            return False, since
        next_since = result.get("next_since")
        return bool(result["diffs"]), next_since if isinstance(next_since, int) else since


def _say_subscribe(response: bytes) -> bytes:
    """The ``initialize`` answer with ``resources.subscribe`` true (stdio can notify)."""
    try:
        message = json.loads(response)
        message["result"]["capabilities"]["resources"]["subscribe"] = True
    except (ValueError, KeyError, TypeError):
        return response  # an error, or a server without resources: relayed as it is
    return jsonrpc.encode(message)
