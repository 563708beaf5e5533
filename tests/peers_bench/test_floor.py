"""The client floor (``null_server.py``) speaks enough MCP for the SDK client the harness uses:
its figures are only a floor if the same client drives it through the same calls."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))

from bench import _client  # noqa: E402
from servers import NullServer  # noqa: E402


def test_the_floor_stores_and_recalls_through_the_sdk_client(tmp_path: Path) -> None:
    peer = NullServer(tmp_path / "work")
    store = peer.new_store(tmp_path)

    async def session() -> tuple[list[str], list[str]]:
        async with _client(peer, store) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            for i in range(3):
                assert await peer.store(client, f"note {i}", "fact", f"m{i}") == f"m{i}"
            return tools, await peer.search(client, "anything", 2)

    tools, keys = asyncio.run(session())
    assert tools == ["remember", "recall"]
    assert keys == ["m1", "m2"]  # the newest two, unranked
    assert peer.contents(store) == ["note 0", "note 1", "note 2"]
