"""The node's counters, gauges and latency histograms, in the Prometheus text format.

Two kinds of numbers live here. What happens at the facade (stores, recalls, MCP tool
calls, and how long they take) is counted as it happens, into prometheus-client
``Counter``/``Histogram`` objects. What the mesh and the storage already count
(frames, diffs received, drops by reason, queue depths, index backlog) is *read* at
scrape time by :class:`_NodeCollector`, so there is one source of truth for each
number and the sans-IO engine never learns about Prometheus.

Every :class:`NodeMetrics` owns its own ``CollectorRegistry``: several services in one
process (tests, benchmarks) never share or collide on a metric.

The REST surface serves the exposition at ``GET /metrics`` (:mod:`api.rest.metrics`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["NodeMetrics", "observed", "InstrumentedTools", "CONTENT_TYPE"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Facade calls take milliseconds (embedding a short text, an HNSW search) to seconds
# (a cold model, a busy disk): buckets from 1 ms to 10 s.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# The 11 MCP tools, named once so the tool-call histogram never gets a label from input.
MCP_TOOLS = frozenset({
    "store", "recall", "query", "start_session", "end_session", "place_beacon", "list_beacons",
    "inbox", "get_scene", "list_scenes", "pull_inbox",
})  # fmt: skip


class NodeMetrics:
    """One node's metrics, in a registry of its own."""

    def __init__(self) -> None:
        # No auto_describe: registering the collector must not read a half-built service.
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.stores = Counter("hyphae_stores", "Cells stored by this node's agents", registry=r)
        self.recalls = Counter(
            "hyphae_recalls", "Nearest-neighbour reads by this node's agents", ["operation"], registry=r
        )
        self.store_seconds = Histogram(
            "hyphae_store_seconds", "Time to store a cell (validate, embed, commit)", buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.recall_seconds = Histogram(
            "hyphae_recall_seconds", "Time to answer recall, query or search", ["operation"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.mcp_tool_seconds = Histogram(
            "hyphae_mcp_tool_seconds", "Time in the facade for one MCP tool call", ["tool", "outcome"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._bound: dict[tuple[str, ...], Any] = {}

    def watch(self, service: Any) -> None:
        """Read the service's own counters (storage, queues, the mesh) at every scrape."""
        self.registry.register(_NodeCollector(service))

    def observe(self, operation: str, seconds: float) -> None:
        """A facade operation finished successfully after ``seconds``."""
        if operation == "store":
            self.stores.inc()
            self.store_seconds.observe(seconds)
        else:
            count, latency = self._children(("recall", operation), lambda: (
                self.recalls.labels(operation), self.recall_seconds.labels(operation)
            ))  # fmt: skip
            count.inc()
            latency.observe(seconds)

    def tool_latency(self, tool: str, outcome: str) -> Any:
        """The ``hyphae_mcp_tool_seconds`` child for one tool and outcome."""
        return self._children(("tool", tool, outcome), lambda: self.mcp_tool_seconds.labels(tool, outcome))

    def _children(self, key: tuple[str, ...], make: Callable[[], Any]) -> Any:
        # labels() hashes and validates its arguments under a lock on every call; a child,
        # once made, never changes, so each is looked up once. Made on first use, as labels()
        # does, so a series appears in the exposition only once it has happened.
        child = self._bound.get(key)
        if child is None:
            child = self._bound[key] = make()
        return child

    def exposition(self) -> bytes:
        """Everything, in the Prometheus text format."""
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, float]:
        """Counters and gauges as ``{"name{label=value}": number}`` (histogram buckets left
        out): what the dashboard shows."""
        values: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_bucket", "_created")):
                    continue
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return values


def observed(operation: str) -> Callable:
    """Decorate a facade coroutine method: count and time it in ``self.metrics`` when it succeeds."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        async def timed(self, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = await method(self, *args, **kwargs)
            self.metrics.observe(operation, time.perf_counter() - started)
            return result

        return timed

    return decorate


class InstrumentedTools:
    """The service as the MCP dispatcher sees it, with each tool call timed.

    The dispatcher calls ``getattr(service, tool_name)(principal, **arguments)``; this
    proxy hands back a timed wrapper for the 11 tools and the real attribute otherwise,
    so ``mcp_bridge`` stays free of metrics.
    """

    def __init__(self, service: Any, metrics: NodeMetrics) -> None:
        self._service = service
        self._metrics = metrics
        self._timed: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        if name not in MCP_TOOLS:
            return getattr(self._service, name)
        timed = self._timed.get(name)
        if timed is None:
            timed = self._timed[name] = self._time(name, getattr(self._service, name))
        return timed

    def _time(self, name: str, target: Callable[..., Any]) -> Callable[..., Any]:
        metrics = self._metrics

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            outcome = "error"
            try:
                result = await target(*args, **kwargs)
                outcome = "ok"
                return result
            finally:
                metrics.tool_latency(name, outcome).observe(time.perf_counter() - started)

        return timed


class _NodeCollector:
    """Reads the numbers the storage, the embedder and the mesh keep anyway."""

    def __init__(self, service: Any) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        service = self._service
        cells = GaugeMetricFamily("hyphae_layer_cells", "Cells indexed per layer", labels=["layer"])
        for layer, size in sorted(service.layers.sizes().items()):
            cells.add_metric([layer], size)
        yield cells
        depths = service.queue_depths()
        yield GaugeMetricFamily(
            "hyphae_index_backlog", "Committed cells the HNSW indexes have not taken yet", value=depths["index_backlog"]
        )
        yield GaugeMetricFamily(
            "hyphae_embed_queue_depth", "Embedding requests waiting for a worker thread", value=depths["embed_queue"]
        )
        yield GaugeMetricFamily(
            "hyphae_mesh_quarantined", "Diffs from the mesh set aside instead of stored (`hyphae doctor` says why)",
            value=service.inbound.quarantined(),
        )  # fmt: skip
        status = service.mesh_status() if service.mesh_status is not None else {"enabled": False}
        yield GaugeMetricFamily("hyphae_mesh_enabled", "1 when this node runs the mesh", value=int(bool(status.get("enabled"))))
        if status.get("enabled"):
            yield from _mesh_metrics(status)


def _mesh_metrics(status: dict[str, Any]) -> Iterator[Metric]:
    peers = status.get("peers", [])
    states = GaugeMetricFamily("hyphae_mesh_peers", "Known peers by liveness state", labels=["state"])
    counts = {"alive": 0, "suspect": 0, "dead": 0}
    for peer in peers:
        counts[peer["state"]] = counts.get(peer["state"], 0) + 1
    for state, count in sorted(counts.items()):
        states.add_metric([state], count)
    yield states
    outbox = GaugeMetricFamily("hyphae_mesh_outbox_depth", "Diffs queued for a peer", labels=["peer"])
    inflight = GaugeMetricFamily("hyphae_mesh_inflight_batches", "Batches sent and not yet acknowledged", labels=["peer"])
    for peer in peers:
        outbox.add_metric([peer["node_id"]], peer.get("queue_depth", 0))
        inflight.add_metric([peer["node_id"]], peer.get("inflight_batches", 0))
    yield outbox
    yield inflight
    lanes = GaugeMetricFamily("hyphae_mesh_send_queue_depth", "Frames waiting to be POSTed, per address", labels=["address"])
    for address, lane in sorted(status.get("runtime", {}).get("lanes", {}).items()):
        lanes.add_metric([address], lane.get("queued", 0))
    yield lanes
    yield GaugeMetricFamily("hyphae_mesh_beacons_known", "Beacons of the team the engine routes by", value=status.get("beacons_known", 0))

    def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
        return CounterMetricFamily(name, documentation, value=value)

    def by_label(name: str, documentation: str, label: str, values: dict[str, Any]) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=[label])
        for key, value in sorted(values.items()):
            family.add_metric([str(key)], value)
        return family

    yield by_label("hyphae_mesh_frames_sent", "Sealed frames sent, by lane", "lane", status.get("frames_sent", {}))
    yield by_label("hyphae_mesh_bytes_sent", "Bytes of sealed frames sent, by lane", "lane", status.get("bytes_sent", {}))
    yield counter("hyphae_mesh_diffs_sent", "Data diffs (cells, tombstones) sent to peers", status.get("data_diffs_sent", 0))
    yield counter("hyphae_mesh_frames_received", "Sealed frames received", status.get("frames_received", 0))
    yield counter("hyphae_mesh_bytes_received", "Bytes of sealed frames received", status.get("bytes_received", 0))
    yield by_label(
        "hyphae_mesh_diffs_received", "Diffs accepted from peers, by kind", "kind", status.get("diffs_accepted", {})
    )
    yield by_label(
        "hyphae_mesh_diffs_dropped", "Diffs and frames rejected or given up, by reason", "reason", status.get("drops", {})
    )
    yield counter("hyphae_mesh_cells_delivered", "Remote cells handed to storage", status.get("cells_delivered", 0))
    yield by_label(
        "hyphae_mesh_cells_stored_from", "Remote cells new to this node, by origin node", "origin",
        status.get("cells_received_from", {}),
    )  # fmt: skip
    yield counter("hyphae_mesh_repairs_requested", "Repair requests sent", status.get("repairs_requested", 0))
    runtime = status.get("runtime", {})
    yield counter(
        "hyphae_mesh_frames_dropped_send_queue_full", "Frames dropped because a peer's send queue was full",
        runtime.get("frames_dropped_queue_full", 0),
    )  # fmt: skip
    yield counter("hyphae_mesh_send_failures", "Frames that could not be delivered", runtime.get("send_failures", 0))
