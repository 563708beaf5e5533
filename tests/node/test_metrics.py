"""``/metrics``: the counters move when the user does things.

The facade's own numbers (stores, recalls, latencies) are read from an in-process
service; the served endpoint, the MCP tool histogram and a mesh drop counted under its
reason come from a real daemon (``run_daemon`` with our h11 server on an ephemeral loopback
port, in a team, mesh on loopback) talked to over HTTP.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from mesh.team import Team
from app.daemon import run_daemon
from node.embedding import HashedEmbedder
from node.errors import InvalidArgument
from app.home import init_home, open_node
from node.teams import adopt_team
from tests.e2e_mesh.cluster import edit_config

from .helpers import store

DEADLINE = 30


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse an exposition (which must parse) into ``{(name, labels): value}``."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_store_and_a_recall_move_their_counters_and_histograms(service, make_agent) -> None:
    principal, _ = await make_agent()
    before = service.metrics.exposition().decode()
    assert value(before, "hyphae_stores_total") == 0
    await store(service, principal, "Use pgvector for the V1 storage backend.", "Decision")
    await store(service, principal, "Lint with ruff.", "Pattern")
    with trio.fail_after(10):
        await service.recall(principal, query="storage backend")
        await service.search(principal, query="linting")
    text = service.metrics.exposition().decode()
    assert value(text, "hyphae_stores_total") == 2
    assert value(text, "hyphae_store_seconds_count") == 2
    assert value(text, "hyphae_store_seconds_sum") > 0
    assert value(text, "hyphae_recalls_total", operation="recall") == 1
    assert value(text, "hyphae_recalls_total", operation="search") == 1
    assert value(text, "hyphae_recall_seconds_count", operation="recall") == 1
    # What storage keeps anyway is read at scrape time.
    assert value(text, "hyphae_layer_cells", layer="L0") + value(text, "hyphae_index_backlog") >= 2
    assert value(text, "hyphae_embed_queue_depth") == 0
    assert value(text, "hyphae_mesh_enabled") == 0


async def test_a_rejected_store_is_not_counted(service, make_agent) -> None:
    principal, _ = await make_agent()
    with pytest.raises(InvalidArgument):
        await service.store(principal, content="", cell_type="Decision")
    assert value(service.metrics.exposition().decode(), "hyphae_stores_total") == 0


async def test_two_services_in_one_process_keep_separate_registries(tmp_path: Path, clock) -> None:
    homes = [tmp_path / "one", tmp_path / "two"]
    for home in homes:
        init_home(home)
    async with open_node(homes[0], embedder=HashedEmbedder(), clock=clock) as one:
        async with open_node(homes[1], embedder=HashedEmbedder(), clock=clock) as two:
            principal, _ = await one.add_agent("alice")
            await store(one, principal, "Only on node one.")
            assert value(one.metrics.exposition().decode(), "hyphae_stores_total") == 1
            assert value(two.metrics.exposition().decode(), "hyphae_stores_total") == 0


# -- the served endpoint, on a real daemon ---------------------------------------------


@pytest.fixture
def team_home(tmp_path: Path) -> Path:
    home = tmp_path / "node"
    init_home(home)
    edit_config(home, "hashed")
    adopt_team(home, Team.create())
    return home


async def test_metrics_are_served_and_count_mcp_calls_and_mesh_drops_by_reason(team_home: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            info = await nursery.start(functools.partial(
                run_daemon, team_home, mesh="127.0.0.1:0", discovery=False, announce=lambda *_: None
            ))  # fmt: skip
            admin = {"x-hyphae-admin": (team_home / "admin.token").read_text().strip()}
            async with httpx.AsyncClient(base_url=info["api_url"], trust_env=False) as http:
                response = await http.get("/metrics")
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/plain; version=")
                assert value(response.text, "hyphae_mesh_enabled") == 1
                assert value(response.text, "hyphae_mesh_diffs_dropped_total", reason="decrypt_failed") == 0

                created = await http.post("/v1/admin/agents", json={"name": "alice"}, headers=admin)
                key = created.json()["api_key"]
                mcp_headers = {"x-hyphae-key": key, "accept": "application/json, text/event-stream"}
                call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "store", "arguments": {"content": "Ship on Fridays.", "cell_type": "Decision"}}}  # fmt: skip
                assert (await http.post("/mcp", json=call, headers=mcp_headers)).status_code == 200
                bad = {**call, "params": {"name": "get_scene", "arguments": {"scene_id": "00000000-0000-4000-8000-000000000000"}}}
                assert (await http.post("/mcp", json=bad, headers=mcp_headers)).status_code == 200
                # A frame sealed under another team's key, straight to the mesh port.
                forged = Team.create().sealer().seal(os.urandom(16).hex(), b"not for this team")
                async with httpx.AsyncClient(trust_env=False) as stranger:
                    await stranger.post(f"http://{info['mesh_address']}/mesh/v1/frames", content=forged)

                text = ""
                for _ in range(200):
                    text = (await http.get("/metrics")).text
                    if value(text, "hyphae_mesh_diffs_dropped_total", reason="decrypt_failed") >= 1:
                        break
                    await trio.sleep(0.05)
                assert value(text, "hyphae_mesh_diffs_dropped_total", reason="decrypt_failed") == 1
                assert value(text, "hyphae_stores_total") == 1
                assert value(text, "hyphae_mcp_tool_seconds_count", tool="store", outcome="ok") == 1
                assert value(text, "hyphae_mcp_tool_seconds_count", tool="get_scene", outcome="error") == 1
                assert value(text, "hyphae_mesh_frames_received_total") >= 1

                # Counters only, for anyone on the loopback port; but no foreign page may read them.
                foreign = await http.get("/metrics", headers={"origin": "https://evil.example"})
                assert foreign.status_code == 403
                assert (await http.post("/metrics")).status_code == 405
            nursery.cancel_scope.cancel()
