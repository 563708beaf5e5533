"""Inbox subscriptions over stdio: subscribe to hyphae://inbox, hear notifications/resources/updated.

The stdio loop runs over in-memory streams that stay open until the test closes them, with a
short poll interval; every wait is for an event (a line written, a look taken) under a generous
deadline, never for a length of time.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from mcp_bridge import Dispatcher, serve_stdio
from mcp_bridge.subscriptions import InboxWatch
from tests.mcp_bridge.fakes import ALICE, BOB, FakeService

DEADLINE = 10
UPDATED = {"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "hyphae://inbox"}}


class Pipe:
    """stdin as a host writes it: lines sent when the test says, EOF when it closes."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[bytes](100)

    async def write(self, message: dict[str, Any]) -> None:
        await self._send.send(json.dumps(message).encode() + b"\n")

    async def close(self) -> None:
        await self._send.send(b"")

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self._receive.receive()


class Screen:
    """stdout as a host reads it: every line kept, and a way to wait for the next one."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self._changed = trio.Event()

    async def send_all(self, data: bytes) -> None:
        self.lines += [json.loads(line) for line in data.splitlines()]
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, check) -> dict[str, Any]:
        with trio.fail_after(DEADLINE):
            while True:
                for line in self.lines:
                    if check(line):
                        return line
                await self._changed.wait()


def request(request_id: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}


async def looks(fake: FakeService, more_than: int) -> None:
    """Wait until the watch has asked the inbox more than ``more_than`` times in all."""
    with trio.fail_after(DEADLINE):
        while sum(1 for method, *_ in fake.calls if method == "inbox") <= more_than:
            await trio.sleep(0.01)


def inbox_looks(fake: FakeService) -> int:
    return sum(1 for method, *_ in fake.calls if method == "inbox")


async def test_a_subscribed_host_hears_of_new_diffs_once_and_eof_ends_the_watch() -> None:
    fake = FakeService()
    await fake.place_beacon(ALICE, query="deploys go through staging", threshold=0.5)
    stdin, stdout = Pipe(), Screen()
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        # The fake's clock, not the wall clock, says when the subscription starts.
        watch = InboxWatch(Dispatcher(fake, server_version="0").bind(ALICE), poll_seconds=0.01, clock=fake.now)

        async def run() -> None:
            await serve_stdio(watch, stdin=stdin, stdout=stdout)
            done.set()

        nursery.start_soon(run)
        await stdin.write(request(1, "initialize", {"protocolVersion": "2025-11-25"}))
        init = await stdout.wait_for(lambda line: line.get("id") == 1)
        assert init["result"]["capabilities"]["resources"]["subscribe"] is True  # stdio can notify

        await stdin.write(request(2, "resources/subscribe", {"uri": "hyphae://inbox"}))
        assert (await stdout.wait_for(lambda line: line.get("id") == 2))["result"] == {}
        await looks(fake, 1)
        assert UPDATED not in stdout.lines  # what was there before subscribing is not news

        await fake.store(BOB, content="Deploys go through staging first.", cell_type="Decision")
        await stdout.wait_for(lambda line: line == UPDATED)
        seen = inbox_looks(fake)
        await looks(fake, seen + 3)
        assert stdout.lines.count(UPDATED) == 1  # the same diff is news once

        await fake.store(BOB, content="Deploys go through staging, then canary.", cell_type="Decision")
        with trio.fail_after(DEADLINE):
            while stdout.lines.count(UPDATED) < 2:
                await stdout.wait_for(lambda line: line == UPDATED)
                await trio.sleep(0.01)

        await stdin.write(request(3, "resources/subscribe", {"uri": "hyphae://cells/x"}))
        refused = await stdout.wait_for(lambda line: line.get("id") == 3)
        assert refused["error"]["code"] == -32602 and refused["error"]["data"]["field"] == "uri"

        await stdin.close()
        with trio.fail_after(DEADLINE):
            await done.wait()  # EOF: the loop returns, the watch with it


async def test_unsubscribe_stops_the_looks_and_subscribe_starts_from_now() -> None:
    fake = FakeService()
    watch = InboxWatch(Dispatcher(fake, server_version="0").bind(ALICE), poll_seconds=0.01, clock=fake.now)
    written: list[bytes] = []

    async def write(line: bytes) -> None:
        written.append(line)

    async def call(request_id: int, method: str, uri: str) -> dict[str, Any]:
        return json.loads(await watch(json.dumps(request(request_id, method, {"uri": uri})).encode()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.serve_notifications, write)
        assert not watch.subscribed
        assert (await call(1, "resources/subscribe", "hyphae://inbox"))["result"] == {}
        assert watch.subscribed
        await looks(fake, 0)
        assert (await call(2, "resources/unsubscribe", "hyphae://inbox"))["result"] == {}
        assert not watch.subscribed
        stopped_at = inbox_looks(fake)
        assert (await call(3, "resources/unsubscribe", "hyphae://beacons"))["error"]["code"] == -32602
        # Subscribing again starts over: still no news, and the looks resume.
        assert (await call(4, "resources/subscribe", "hyphae://inbox"))["result"] == {}
        await looks(fake, stopped_at + 1)
        nursery.cancel_scope.cancel()
    assert written == []


@pytest.mark.parametrize("subscriptions", [True, False])
async def test_serve_stdio_adds_subscriptions_unless_told_not_to(subscriptions) -> None:
    stdin, stdout = Pipe(), Screen()
    fake = FakeService()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_stdio(Dispatcher(fake, server_version="0").bind(ALICE), stdin=stdin,
                                               stdout=stdout, subscriptions=subscriptions))
        await stdin.write(request(1, "initialize", {}))
        init = await stdout.wait_for(lambda line: line.get("id") == 1)
        assert init["result"]["capabilities"]["resources"]["subscribe"] is subscriptions
        await stdin.write(request(2, "resources/subscribe", {"uri": "hyphae://inbox"}))
        answer = await stdout.wait_for(lambda line: line.get("id") == 2)
        assert answer == ({"jsonrpc": "2.0", "id": 2, "result": {}} if subscriptions
                          else {**answer, "error": {**answer["error"], "code": -32601}})
        await stdin.close()
