"""``hyphae reindex``: after the embedder changes, every memory is embedded again and found
again; an interrupted reindex leaves a node that opens and a rerun that finishes."""

from __future__ import annotations

import io
import json
from http.server import BaseHTTPRequestHandler

import pytest
import trio

from node import reindex as reindex_module
from app.cli import main
from app.daemon_file import DAEMON_FILE
from node.embedding import HashedEmbedder, RemoteEmbedder
from node.errors import Unavailable
from app.home import open_node
from node.lock import DataDirLock
from node.progress import Progress
from node.reindex import reindex

from .helpers import http_server, reply_json

OLD, NEW = HashedEmbedder(), HashedEmbedder(dim=64)
TEXTS = [f"Service {i} retries failed calls with exponential backoff number {i}." for i in range(7)]


async def fill(home, clock) -> tuple[list[str], str]:
    async with open_node(home, embedder=OLD, clock=clock) as service:
        alice, _ = await service.add_agent("alice")
        ids = [(await service.store(alice, content=text, cell_type="Pattern"))["node_id"] for text in TEXTS]
        beacon = (await service.place_beacon(alice, query="backoff and retries"))["beacon_id"]
    return ids, beacon


async def spaces(home, clock) -> dict[str, int]:
    async with open_node(home, embedder=NEW, clock=clock) as service:
        rows = service.db.query("SELECT embedding_space, COUNT(*) FROM cells GROUP BY embedding_space")
        rows += service.db.query("SELECT 'beacon:' || embedding_space, COUNT(*) FROM beacons GROUP BY embedding_space")
    return dict(rows)


async def found(home, clock, ids) -> set[str]:
    """Which of ``ids`` a search in the new space finds."""
    async with open_node(home, embedder=NEW, clock=clock) as service:
        reader, _ = await service.add_agent(f"reader{clock()}")
        hits = (await service.search(reader, query="retries failed calls with exponential backoff", k=20))["results"]
    return {hit["node_id"] for hit in hits} & set(ids)


async def test_reindex_moves_everything_into_the_new_space(home, clock):
    ids, _ = await fill(home, clock)
    assert await found(home, clock, ids) == set()  # the old vectors stay out of the new index
    steps: list[tuple[str, int, int]] = []
    with trio.fail_after(60):
        result = await reindex(home, embedder=NEW, progress=lambda *step: steps.append(step))
    assert (result["cells"], result["beacons"], result["rebuilt"]) == (7, 1, True)
    assert result["embedding_space"] == NEW.space and result["layers"]["L0"].startswith("rebuilt")
    assert steps[0] == ("re-embedding cells", 7, 7)
    assert ("re-embedding beacons", 1, 1) in steps and steps[-1] == ("rebuilding L0", 7, 7)
    assert await spaces(home, clock) == {NEW.space: 7, f"beacon:{NEW.space}": 1}
    assert await found(home, clock, ids) == set(ids)
    assert json.loads((home / "index" / "L0.meta.json").read_text())["space"] == NEW.space

    again = await reindex(home, embedder=NEW)
    assert (again["cells"], again["beacons"], again["rebuilt"]) == (0, 0, False)


class Interrupted(Exception):
    pass


async def test_an_interrupted_reindex_leaves_a_node_that_opens_and_a_rerun_finishes(home, clock, monkeypatch):
    ids, _ = await fill(home, clock)
    monkeypatch.setattr(reindex_module, "BATCH", 3)

    def stop_after_one_batch(what: str, done: int, total: int) -> None:
        raise Interrupted

    with pytest.raises(Interrupted):
        await reindex(home, embedder=NEW, progress=stop_after_one_batch)
    assert not (home / "index" / "L0.meta.json").exists()  # dropped first: nothing stale can be loaded
    assert await spaces(home, clock) == {NEW.space: 3, OLD.space: 4, f"beacon:{OLD.space}": 1}
    assert len(await found(home, clock, ids)) == 3  # the node opens and finds what moved already

    result = await reindex(home, embedder=NEW)
    assert (result["cells"], result["beacons"]) == (4, 1)
    assert await found(home, clock, ids) == set(ids)


async def test_reindex_needs_the_data_dir_to_itself(home):
    lock = DataDirLock(home / "node.lock").acquire()
    try:
        with pytest.raises(Unavailable, match="another Hyphae process"):
            await reindex(home, embedder=NEW)
    finally:
        lock.release()


def test_the_cli_refuses_while_a_daemon_runs(home, capsys):
    lock = DataDirLock(home / "node.lock").acquire()  # what a running daemon holds
    try:
        (home / DAEMON_FILE).write_text(json.dumps({"pid": 4242, "api_url": "http://127.0.0.1:9", "node_id": "x"}))
        assert main(["--home", str(home), "reindex"]) == 1
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert "a node is running" in err and "pid 4242" in err and "stop the node" in err


def test_the_cli_reindexes_after_the_embedder_changes(home, clock, capsys, minilm):
    ids, _ = trio.run(fill, home, clock)
    config = home / "config.toml"
    assert 'provider = "builtin"' in config.read_text()  # fill() wrote hashed vectors; the config says builtin
    assert main(["--home", str(home), "reindex", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["cells"] == 7 and result["embedding_space"] == minilm.space
    assert err == ""  # --json: no progress bar
    assert main(["--home", str(home), "reindex"]) == 0
    assert "nothing to do" in capsys.readouterr().out


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_on_a_terminal_only():
    screen = Terminal()
    with Progress("importing", 4, stream=screen) as bar:
        for done in range(1, 5):
            bar.update(done)
    assert "importing [" in screen.getvalue() and "4/4 (100%)" in screen.getvalue()
    assert screen.getvalue().endswith("\n")

    pipe = io.StringIO()
    with Progress("importing", 4, stream=pipe) as bar:
        bar.update(4)
    assert pipe.getvalue() == ""
    quiet = Terminal()
    with Progress("importing", 4, stream=quiet, enabled=False) as bar:
        bar.update(4)
    assert quiet.getvalue() == ""


# -- into a remote embedder's space, over a real socket -------------------------------------------


class FakeOpenAI(BaseHTTPRequestHandler):
    """An OpenAI-compatible /v1/embeddings on 127.0.0.1: the server's ``inputs`` records each
    request's batch; ``failures`` answers that many requests with 503 first."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        if server.failures:
            server.failures -= 1
            self.send_error(503)
            return
        server.inputs.append(body["input"])
        data = [{"index": i, "embedding": HashedEmbedder(dim=8).embed([text])[0].tolist()} for i, text in enumerate(body["input"])]
        reply_json(self, {"data": data, "model": body["model"]})

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def openai_server():
    with http_server(FakeOpenAI) as server:
        server.inputs, server.failures = [], 0
        yield server


async def test_reindex_into_a_remote_space_in_batches_and_survive_the_service_going_down(
    home, clock, openai_server, monkeypatch
):
    monkeypatch.setattr(reindex_module, "BATCH", 4)
    ids, _ = await fill(home, clock)
    url = f"http://127.0.0.1:{openai_server.server_address[1]}"
    remote = RemoteEmbedder("openai", url, "fake-embed", batch_size=4, backoff_interval=0.01)
    openai_server.failures = 1  # a 503 at first: retried
    result = await reindex(home, embedder=remote)
    assert (result["cells"], result["beacons"]) == (7, 1) and result["embedding_space"] == "remote/openai/fake-embed/8"
    sizes = [len(batch) for batch in openai_server.inputs]
    assert sizes[0] == 1 and sizes[1:] == [4, 3, 1]  # the dim probe, then cells by 4, then the beacon

    # The service goes down halfway through a reindex into yet another model: a clear error naming it,
    # and a node that still opens; once the service is back, a rerun finishes.
    other = RemoteEmbedder("openai", url, "fake-embed-2", dim=8, batch_size=4, backoff_interval=0.01)
    openai_server.inputs.clear()
    calls = 0

    def down_after_first_batch(what: str, done: int, total: int) -> None:
        nonlocal calls
        calls += 1
        openai_server.failures = 100

    with pytest.raises(Unavailable, match=f"{url}/v1/embeddings.*3 attempts.*HTTP 503"):
        await reindex(home, embedder=other, progress=down_after_first_batch)
    assert calls == 1
    async with open_node(home, embedder=other, clock=clock) as service:
        assert service.layers.sizes()["L0"] == 4  # what moved is found already
    openai_server.failures = 0
    result = await reindex(home, embedder=other)
    assert (result["cells"], result["beacons"]) == (3, 1)
    assert await spaces(home, clock) == {other.space: 7, f"beacon:{other.space}": 1}
