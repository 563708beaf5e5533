"""The gRPC surface of a real ``hyphae up`` over loopback: a client built from the repo's
``.proto``, a generic client that knows only what reflection tells it, the health service,
every status code a caller can meet, and keys that are bad or revoked.

One daemon serves the module (agents made before it starts); the rate-limit test has its
own daemon with a tiny limit, and the shutdown test its own too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.e2e.conftest import (
    Daemon,
    add_agent,
    make_home,
    prepare_agents,
    run_cli,
    start_daemon,
)

from .grpc_helpers import DEADLINE, key, pb, refusal, stub


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[tuple[Daemon, dict[str, str]]]:
    home = make_home(tmp_path_factory.mktemp("grpc") / "home")
    keys = prepare_agents(home, "alice", "bob", "gone")
    daemon = start_daemon(home)
    try:
        keys["carol"] = add_agent(home, "carol", "alpha")  # reads only project alpha
        yield daemon, keys
    finally:
        daemon.stop()


def address(daemon: Daemon) -> str:
    return daemon.info["grpc_address"]


def test_the_daemon_serves_grpc_beside_the_api_and_says_where(node) -> None:
    daemon, _ = node
    host, _, port = address(daemon).rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert json.loads((daemon.home / "daemon.json").read_text())["grpc_address"] == address(daemon)
    assert f"gRPC: hyphae.v1.Memory on {address(daemon)}" in daemon.log.read_text()


def test_a_client_from_the_proto_reaches_every_operation(node) -> None:
    daemon, keys = node
    alice, bob = key(keys["alice"]), (("authorization", f"Bearer {keys['bob']}"),)  # both ways of sending a key
    with stub(address(daemon)) as memory:
        placed = memory.PlaceBeacon(pb.PlaceBeaconRequest(query="which queue carries billing events", threshold=0.1),
                                    metadata=bob, timeout=DEADLINE)  # fmt: skip
        assert [b.beacon_id for b in memory.ListBeacons(pb.ListBeaconsRequest(), metadata=bob).beacons] == [placed.beacon_id]

        session = memory.StartSession(pb.StartSessionRequest(project="billing", title="queues"), metadata=alice)
        first = memory.Store(pb.StoreRequest(content="billing events travel on the orders queue", cell_type="Decision",
                                             salience=0.8), metadata=alice, timeout=DEADLINE)  # fmt: skip
        cell = memory.GetCell(pb.GetCellRequest(node_id=first.node_id), metadata=alice)
        assert (cell.content, cell.cell_type, cell.project, cell.scene_id) == (
            "billing events travel on the orders queue", "Decision", "billing", session.scene_id)
        assert cell.provenance.local and cell.status == "active"

        # Recall hydrates: full cells, with their distance, in the key's scope.
        hits = memory.Recall(pb.RecallRequest(query="billing events queue", k=5), metadata=alice, timeout=DEADLINE)
        assert hits.results[0].node_id == first.node_id and hits.results[0].content == cell.content
        assert hits.results[0].HasField("distance")
        layer = memory.Query(pb.QueryRequest(query="billing events queue", layer="L0", k=5), metadata=alice)
        assert [c.node_id for c in layer.results] == [c.node_id for c in hits.results]

        # Supersede rides on Store: metadata.supersedes names the cell replaced.
        newer = pb.StoreRequest(content="billing events travel on the ledger queue", cell_type="Decision")
        newer.metadata.update({"supersedes": [first.node_id]})
        second = memory.Store(newer, metadata=alice, timeout=DEADLINE)
        assert memory.GetCell(pb.GetCellRequest(node_id=first.node_id), metadata=alice).superseded_by == second.node_id
        current = memory.Recall(pb.RecallRequest(query="billing events queue"), metadata=alice, timeout=DEADLINE)
        assert first.node_id not in [c.node_id for c in current.results]

        ended = memory.EndSession(pb.EndSessionRequest(session_id=session.session_id), metadata=alice)
        assert ended.session_id == session.session_id and ended.HasField("ended_at")
        scene = memory.GetScene(pb.GetSceneRequest(scene_id=session.scene_id), metadata=alice)
        assert set(scene.cell_ids) == {first.node_id, second.node_id} and scene.project == "billing"
        assert session.scene_id in [s.scene_id for s in memory.ListScenes(pb.ListScenesRequest(), metadata=alice).scenes]
        summary = memory.ConsolidateScene(pb.ConsolidateSceneRequest(scene_id=session.scene_id), metadata=alice)
        assert memory.GetCell(pb.GetCellRequest(node_id=summary.node_id), metadata=alice).layer == "L2"

        # Bob's beacon caught Alice's stores: Inbox reads, PullInbox advances its cursor.
        assert first.node_id not in [d.node_id for d in memory.Inbox(pb.InboxRequest(), metadata=bob).diffs]  # superseded
        seen = memory.Inbox(pb.InboxRequest(include_superseded=True), metadata=bob)
        assert first.node_id in [d.node_id for d in seen.diffs]
        assert all(d.beacon_id == placed.beacon_id for d in seen.diffs if d.kind == "match")
        pulled = memory.PullInbox(pb.PullInboxRequest(limit=100, include_superseded=True), metadata=bob)
        assert [d.inbox_id for d in pulled.diffs] == [d.inbox_id for d in seen.diffs]
        assert memory.PullInbox(pb.PullInboxRequest(), metadata=bob).diffs == []
        later = memory.Inbox(pb.InboxRequest(since=str(seen.next_since), include_superseded=True), metadata=bob)
        assert later.diffs == []

        forgotten = memory.Forget(pb.ForgetRequest(node_id=second.node_id), metadata=alice)
        assert forgotten.node_id == second.node_id and forgotten.forgotten_at > 0
        assert memory.GetCell(pb.GetCellRequest(node_id=second.node_id), metadata=alice).status == "forgotten"
        removed = memory.RemoveBeacon(pb.RemoveBeaconRequest(beacon_id=placed.beacon_id), metadata=bob)
        assert removed.beacon_id == placed.beacon_id
        assert memory.ListBeacons(pb.ListBeaconsRequest(), metadata=bob).beacons == []


def test_a_generic_client_needs_only_reflection(node) -> None:
    """No ``.proto`` and no generated module: the descriptors come from the server itself."""
    daemon, keys = node
    channel = grpc.insecure_channel(address(daemon))
    try:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert "hyphae.v1.Memory" in database.get_services()
        assert "grpc.health.v1.Health" in database.get_services()
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName("hyphae.v1.Memory")

        def call(name: str, **fields):
            method = service.methods_by_name[name]
            request = message_factory.GetMessageClass(method.input_type)(**fields)
            reply_class = message_factory.GetMessageClass(method.output_type)
            rpc = channel.unary_unary(f"/hyphae.v1.Memory/{name}", request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=reply_class.FromString)  # fmt: skip
            return rpc(request, metadata=key(keys["alice"]), timeout=DEADLINE)

        stored = call("Store", content="reflection clients speak protobuf without the .proto", cell_type="Fact")
        recalled = call("Recall", query="reflection clients protobuf", k=3)
        assert recalled.results[0].node_id == stored.node_id
        assert recalled.results[0].content == "reflection clients speak protobuf without the .proto"
    finally:
        channel.close()


def test_the_standard_health_service_answers(node) -> None:
    daemon, _ = node
    with grpc.insecure_channel(address(daemon)) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "hyphae.v1.Memory"):
            assert health.Check(health_pb2.HealthCheckRequest(service=name), timeout=DEADLINE).status == \
                health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as caught:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=DEADLINE)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def refused(call, request, metadata):
    with pytest.raises(grpc.RpcError) as caught:
        call(request, metadata=metadata, timeout=DEADLINE)
    return refusal(caught.value)


def test_each_error_kind_has_its_status_code_and_reason(node) -> None:
    daemon, keys = node
    alice, carol = key(keys["alice"]), key(keys["carol"])
    with stub(address(daemon)) as memory:
        before = memory.Recall(pb.RecallRequest(query="a decision about caches"), metadata=alice, timeout=DEADLINE)

        bad = refused(memory.Store, pb.StoreRequest(content="caches", cell_type="Hunch"), alice)
        assert (bad.code, bad.reason, bad.field) == (grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", "cell_type")
        big = refused(memory.Store, pb.StoreRequest(content="x" * 200_000, cell_type="Fact"), alice)
        assert (big.code, big.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "too_large")
        after = memory.Recall(pb.RecallRequest(query="a decision about caches"), metadata=alice, timeout=DEADLINE)
        assert after == before  # a refused store changed nothing

        missing = refused(memory.GetCell, pb.GetCellRequest(node_id="01a24a14-7e57-7670-914a-ddd92168b13b"), alice)
        assert (missing.code, missing.reason, missing.field) == (grpc.StatusCode.NOT_FOUND, "not_found", "node_id")

        elsewhere = memory.Store(pb.StoreRequest(content="beta's cache is redis", cell_type="Fact", project="beta"),
                                 metadata=alice, timeout=DEADLINE)  # fmt: skip
        denied = refused(memory.GetCell, pb.GetCellRequest(node_id=elsewhere.node_id), carol)
        assert (denied.code, denied.reason) == (grpc.StatusCode.PERMISSION_DENIED, "forbidden")
        outside = refused(memory.Recall, pb.RecallRequest(query="cache", project="beta"), carol)
        assert (outside.code, outside.reason, outside.field) == (grpc.StatusCode.PERMISSION_DENIED, "forbidden", "project")

        session = memory.StartSession(pb.StartSessionRequest(project="beta"), metadata=alice)
        memory.Store(pb.StoreRequest(content="beta's cache evicts by LRU", cell_type="Fact"), metadata=alice)
        memory.EndSession(pb.EndSessionRequest(session_id=session.session_id), metadata=alice)
        memory.ConsolidateScene(pb.ConsolidateSceneRequest(scene_id=session.scene_id), metadata=alice)
        again = refused(memory.ConsolidateScene, pb.ConsolidateSceneRequest(scene_id=session.scene_id), alice)
        assert (again.code, again.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "conflict")


def test_no_key_a_bad_key_and_a_revoked_key_are_unauthenticated(node) -> None:
    daemon, keys = node
    request = pb.RecallRequest(query="anything")
    with stub(address(daemon)) as memory:
        for metadata in ((), key("hy_not_a_key"), (("authorization", "Bearer hy_not_a_key"),), (("authorization", "Basic x"),)):
            got = refused(memory.Recall, request, metadata)
            assert (got.code, got.reason) == (grpc.StatusCode.UNAUTHENTICATED, "unauthenticated"), metadata
        assert memory.Recall(request, metadata=key(keys["gone"]), timeout=DEADLINE) is not None
        run_cli(daemon.home, "agent", "revoke", "gone")
        revoked = refused(memory.Recall, request, key(keys["gone"]))
        assert (revoked.code, revoked.reason) == (grpc.StatusCode.UNAUTHENTICATED, "unauthenticated")


def test_identity_never_comes_from_a_message(node) -> None:
    """The request messages have no identity fields at all, and the cell names the key's agent."""
    daemon, keys = node
    for message in pb.DESCRIPTOR.message_types_by_name.values():
        if message.name.endswith("Request"):
            assert not {"source_agent", "tenant_id", "agent_id"} & set(message.fields_by_name), message.name
    with stub(address(daemon)) as memory:
        whoami = daemon.client(keys["bob"]).get("/v1/whoami").json()
        stored = memory.Store(pb.StoreRequest(content="bob wrote this", cell_type="Fact"), metadata=key(keys["bob"]))
        cell = memory.GetCell(pb.GetCellRequest(node_id=stored.node_id), metadata=key(keys["bob"]))
        assert (cell.source_agent, cell.tenant_id) == (whoami["agent_id"], whoami["tenant_id"])


# -- a daemon with a tiny rate limit ------------------------------------------------------------


def test_an_exhausted_rate_limit_is_resource_exhausted_with_retry_info(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    config = home / "config.toml"
    config.write_text(config.read_text().replace(
        'listen = "127.0.0.1:0"', 'listen = "127.0.0.1:0"\nrate_limit = 0.5\nrate_burst = 3', 1))  # fmt: skip
    keys = prepare_agents(home, "looper")
    daemon = start_daemon(home)
    try:
        with stub(address(daemon)) as memory:
            request = pb.RecallRequest(query="again")
            codes = []
            for _ in range(6):
                try:
                    memory.Recall(request, metadata=key(keys["looper"]), timeout=DEADLINE)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as error:
                    codes.append(error.code())
                    limited = refusal(error)
            assert codes[:3] == [grpc.StatusCode.OK] * 3 and grpc.StatusCode.RESOURCE_EXHAUSTED in codes[3:]
            assert limited.reason == "rate_limited"
            assert limited.retry_delay_ms is not None and limited.retry_delay_ms > 0
            assert limited.pushback_ms == str(limited.retry_delay_ms)
    finally:
        daemon.stop()


# -- a node that stops while a watch streams ------------------------------------------------------


def test_a_watch_pushes_news_then_ends_unavailable_when_the_node_shuts_down(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    keys = prepare_agents(home, "watcher", "writer")
    daemon = start_daemon(home)
    ended: list[grpc.RpcError | None] = []
    try:
        with stub(address(daemon)) as memory:
            memory.PlaceBeacon(pb.PlaceBeaconRequest(query="the deploy freeze starts friday", threshold=0.1),
                               metadata=key(keys["watcher"]), timeout=DEADLINE)  # fmt: skip
            # since=0: from the inbox's start, so the store below is pushed whenever the watch begins
            stream = memory.WatchInbox(pb.WatchInboxRequest(since="0"), metadata=key(keys["watcher"]), timeout=120)
            memory.Store(pb.StoreRequest(content="the deploy freeze starts friday", cell_type="Constraint"),
                         metadata=key(keys["writer"]), timeout=DEADLINE)  # fmt: skip
            first = next(stream)
            assert (first.content, first.kind, first.cell_type) == ("the deploy freeze starts friday", "match", "Constraint")

            def drain() -> None:
                try:
                    for _ in stream:
                        pass
                    ended.append(None)
                except grpc.RpcError as error:
                    ended.append(error)

            reader = threading.Thread(target=drain)
            reader.start()
            assert daemon.stop() == 0
            reader.join(DEADLINE)
            assert not reader.is_alive()
    finally:
        daemon.stop()
    assert ended and ended[0] is not None
    got = refusal(ended[0])
    assert (got.code, got.reason) == (grpc.StatusCode.UNAVAILABLE, "unavailable")
