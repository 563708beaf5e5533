"""The gRPC surface (``hyphae.v1.Memory``): grpcio's threads in front of the trio core.

grpcio serves from a thread pool; the core lives on the daemon's trio loop. They meet at
one bridge, :meth:`GrpcSurface._run`: a handler thread hands the whole call (authenticate,
then the facade method) to the loop with ``trio.from_thread.run`` and blocks only itself,
so the loop never waits on grpcio. Each RPC is one row of ``RPCS``: the facade method it
reaches and the reply message its result becomes. Requests are read field by field (only
the fields a client set), results are the facade's JSON-ready dicts parsed into the reply
message, so a field the core adds and the ``.proto`` lacks is dropped rather than failing.

Keys come per call in the ``x-hyphae-key`` metadata entry or ``authorization: Bearer``;
identity is never read from a message. The standard health service (``grpc.health.v1``)
and server reflection are served beside it, so generic clients need no ``.proto``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import trio
from google.protobuf import json_format
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from node.cells import parse_time_ms
from node.errors import HyphaeError, Unauthenticated, Unavailable
from node.service import MemoryService

from .errors import internal_status, status_of
from .hyphae.v1 import memory_pb2 as pb

__all__ = ["RPCS", "SERVICE_NAME", "WATCH_POLL_S", "GrpcSurface"]

log = logging.getLogger("hyphae.grpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Memory"].full_name  # "hyphae.v1.Memory"
WORKERS = 32  # handler threads: calls in flight at once (a WatchInbox holds one while it streams)
WATCH_POLL_S = 0.25  # how often a WatchInbox looks at the inbox (a cheap indexed read on the loop)
WATCH_SLICE_S = 2.0  # how long the loop waits for news before the stream thread checks its client


@dataclasses.dataclass(frozen=True)
class Rpc:
    """One unary RPC: the facade method it reaches, fixed arguments, and its reply message."""

    method: str
    reply: type[Message]
    fixed: tuple[tuple[str, Any], ...] = ()


RPCS: dict[str, Rpc] = {
    "Store": Rpc("store", pb.StoreReply),
    # gRPC hydrates: Recall and Query answer full cells, through the facade's hydrating search.
    "Recall": Rpc("search", pb.CellsReply, (("layer", "L0"),)),
    "Query": Rpc("search", pb.CellsReply),
    "GetCell": Rpc("get_cell", pb.Cell),
    "Forget": Rpc("forget", pb.ForgetReply),
    "StartSession": Rpc("start_session", pb.Session),
    "EndSession": Rpc("end_session", pb.Session),
    "GetScene": Rpc("get_scene", pb.Scene),
    "ListScenes": Rpc("list_scenes", pb.ScenesReply),
    "ConsolidateScene": Rpc("consolidate_scene", pb.ConsolidateReply),
    "PlaceBeacon": Rpc("place_beacon", pb.BeaconPlaced),
    "ListBeacons": Rpc("list_beacons", pb.BeaconsReply),
    "RemoveBeacon": Rpc("remove_beacon", pb.BeaconRemoved),
    "Inbox": Rpc("inbox", pb.InboxReply),
    "PullInbox": Rpc("pull_inbox", pb.InboxReply),
}


def arguments(request: Message) -> dict[str, Any]:
    """The fields a client set, as the facade's keyword arguments (structs as dicts)."""
    out: dict[str, Any] = {}
    for field, value in request.ListFields():
        if field.message_type is not None:  # google.protobuf.Struct
            value = json_format.MessageToDict(value)
        elif not isinstance(value, (str, bool, int, float)):  # a repeated field
            value = list(value)
        out[field.name] = value
    if isinstance(out.get("since"), str) and out["since"].isascii() and out["since"].isdigit():
        out["since"] = int(out["since"])  # ms since the epoch, as REST reads it
    return out


def reply_of(result: dict[str, Any], reply: type[Message]) -> Message:
    """A facade result as ``reply``: the fields the message has, None left unset. Built by
    hand rather than with json_format.ParseDict, which costs more than the recall itself."""
    message = reply()
    for name, value in result.items():
        if value is None:
            continue
        kind = _fields_of(reply).get(name)
        if kind is None:
            continue  # the core gained a field the .proto has not: dropped, not an error
        if kind is _STRUCT:
            getattr(message, name).update(value)
        elif kind is _SCALAR:
            setattr(message, name, value)
        elif kind is _REPEATED:
            getattr(message, name).extend(value)
        elif isinstance(kind, tuple):  # repeated messages
            getattr(message, name).extend(reply_of(item, kind[0]) for item in value)
        else:
            getattr(message, name).CopyFrom(reply_of(value, kind))
    return message


_STRUCT, _SCALAR, _REPEATED = object(), object(), object()
_FIELDS: dict[type[Message], dict[str, Any]] = {}


def _fields_of(reply: type[Message]) -> dict[str, Any]:
    """How to set each field of a message type (worked out once per type)."""
    fields = _FIELDS.get(reply)
    if fields is None:
        fields = {}
        for field in reply.DESCRIPTOR.fields:
            repeated = field.is_repeated
            if field.message_type is None:
                fields[field.name] = _REPEATED if repeated else _SCALAR
            elif field.message_type.full_name == "google.protobuf.Struct":
                fields[field.name] = _STRUCT
            else:
                sub = getattr(pb, field.message_type.name)
                fields[field.name] = (sub,) if repeated else sub
        _FIELDS[reply] = fields
    return fields


def api_key(context: grpc.ServicerContext) -> str | None:
    metadata = dict(context.invocation_metadata() or ())
    key = metadata.get("x-hyphae-key")
    if key is None:
        auth = metadata.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
    return key or None


class GrpcSurface:
    """The gRPC server of one daemon. Construct and :meth:`start` on the trio loop."""

    def __init__(self, service: MemoryService, *, workers: int = WORKERS) -> None:
        self.service = service
        self._token: trio.lowlevel.TrioToken | None = None
        self._closing = False
        self.health = health.HealthServicer()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hyphae-grpc"),
            # Without this grpcio sets SO_REUSEPORT, and a second node would share the port silently.
            options=[("grpc.so_reuseport", 0)],
        )
        handlers = {name: self._unary(name, rpc) for name, rpc in RPCS.items()}
        handlers["WatchInbox"] = grpc.unary_stream_rpc_method_handler(
            self._watch_inbox, request_deserializer=pb.WatchInboxRequest.FromString,
            response_serializer=pb.InboxEntry.SerializeToString,
        )  # fmt: skip
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)

    def bind(self, host: str, port: int) -> str:
        """Listen on ``host:port`` (port 0: any free one); the address bound."""
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = self.server.add_insecure_port(where)
        except RuntimeError:
            bound = 0
        if not bound:
            raise Unavailable(f"cannot listen for gRPC on {host}:{port}: the port is in use or the address is not "
                              f"this machine's; pick another with `hyphae up --grpc HOST:PORT` (or `--no-grpc`)")  # fmt: skip
        return f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"

    def start(self) -> None:
        """Serve (call on the trio loop: the handlers come back to it)."""
        self._token = trio.lowlevel.current_trio_token()
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        """Refuse new calls, let calls in flight finish for ``grace`` seconds, end watches."""
        self._closing = True
        self.health.enter_graceful_shutdown()
        done = self.server.stop(grace)
        await trio.to_thread.run_sync(done.wait)

    # -- the bridge ---------------------------------------------------------------

    def _run(self, context: grpc.ServicerContext, call: Callable[..., Any], *args: Any) -> Any:
        """Run ``call(principal, *args)`` on the trio loop for the caller behind the call's key."""
        key = api_key(context)

        async def authenticated() -> Any:
            if key is None:
                raise Unauthenticated("no API key: send it in the x-hyphae-key metadata (or authorization: Bearer)")
            return await call(await self.service.authenticate(key), *args)

        try:
            if self._closing:
                raise Unavailable("the node is shutting down")
            return trio.from_thread.run(authenticated, trio_token=self._token)
        except HyphaeError as exc:
            context.abort_with_status(status_of(exc))
        except trio.RunFinishedError:
            context.abort_with_status(status_of(Unavailable("the node is shutting down")))
        except Exception as exc:  # noqa: BLE001 - a bug: INTERNAL, logged, never the traceback to the client
            context.abort_with_status(internal_status(exc))

    def _unary(self, name: str, rpc: Rpc) -> grpc.RpcMethodHandler:
        request_type = getattr(pb, pb.DESCRIPTOR.services_by_name["Memory"].methods_by_name[name].input_type.name)
        method = getattr(self.service, rpc.method)
        fixed = dict(rpc.fixed)

        def handle(request: Message, context: grpc.ServicerContext) -> Message:
            kwargs = {**arguments(request), **fixed}

            async def call(principal):
                return await method(principal, **kwargs)

            return reply_of(self._run(context, call), rpc.reply)  # built here, off the trio loop

        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=request_type.FromString, response_serializer=rpc.reply.SerializeToString
        )

    def _watch_inbox(self, request: pb.WatchInboxRequest, context: grpc.ServicerContext) -> Iterator[pb.InboxEntry]:
        """Push each inbox entry as it arrives. The loop polls the inbox every WATCH_POLL_S
        (sleeping between looks, never spinning) and returns after WATCH_SLICE_S without news,
        so this thread can see a client that went away or a node that is stopping."""
        kwargs = arguments(request)
        service = self.service

        async def first_since(_principal) -> int:
            return parse_time_ms(kwargs["since"], "since") if "since" in kwargs else service.clock()

        since = self._run(context, first_since)
        seen: dict[int, int] = {}  # inbox_id -> received_at, of what was sent at the last ms or so
        every = kwargs.get("include_superseded", False)

        async def news(principal) -> list[dict[str, Any]]:
            with trio.move_on_after(WATCH_SLICE_S):
                while True:
                    # Entries of the same millisecond as the last one may land after it: look
                    # one ms back and skip what was sent.
                    page = await service.inbox(principal, since=max(0, since - 1), limit=100, include_superseded=every)
                    fresh = [d for d in page["diffs"] if d["inbox_id"] not in seen]
                    if fresh:
                        return fresh
                    await trio.sleep(WATCH_POLL_S)
            return []

        while context.is_active() and not self._closing:
            for entry in self._run(context, news):
                seen[entry["inbox_id"]] = entry["received_at"]
                since = max(since, entry["received_at"])
                yield reply_of(entry, pb.InboxEntry)
            seen = {i: at for i, at in seen.items() if at >= since - 1}
        if self._closing:  # the client should watch again once the node is back, from the last received_at
            context.abort_with_status(status_of(Unavailable("the node is shutting down")))
