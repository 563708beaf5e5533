"""Fault injection for the real HTTP transport: partitions, delay and loss between processes.

The simulator cuts links in :class:`mesh.testing.VirtualNetwork`; real processes need
the same without network namespaces or root. A :class:`FaultPlan` is consulted by the
transport on every outgoing frame (:meth:`FaultPlan.outgoing`) and by the mesh
endpoint on every incoming one (:meth:`FaultPlan.blocks_incoming`). Rules name
addresses as ``"host:port"`` (one peer) or ``"host"`` (every port of that host).

Outgoing frames to a blocked address fail at once with ``SendError("partitioned")``
(what an unreachable peer looks like to the engine: a failed send); a lost frame
vanishes silently, as if lost after the peer acknowledged the HTTP request (the
engine's acks and repair must cope). Incoming frames from a blocked address get a
503. Between two nodes in one process, where every sender is ``127.0.0.1`` with an
ephemeral port, partition each side's *outgoing* traffic: ``a.partition(b)`` and
``b.partition(a)``. Random choices come from a seeded ``random.Random``.

A daemon started with ``HYPHAE_MESH_FAULTS=/path/faults.json`` (a test hook, see
``app/mesh_node.py``) keeps its plan equal to that file (:func:`watch_fault_file`,
:meth:`FaultPlan.apply_spec`), so tests with real processes partition, slow down and
heal running daemons by rewriting one file per node.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import random
from collections.abc import Mapping
from typing import Any

import trio

__all__ = ["FaultPlan", "Verdict", "watch_fault_file"]

log = logging.getLogger("hyphae.mesh.faults")


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What happens to one outgoing frame."""

    blocked: bool = False
    lost: bool = False
    delay: float = 0.0  # seconds before the frame leaves


_PASS = Verdict()


def _host(address: str) -> str:
    host, sep, port = address.rpartition(":")
    return host.strip("[]") if sep and port.isdigit() else address.strip("[]")


class FaultPlan:
    """A mutable set of faults; tests change it while traffic flows."""

    def __init__(self, *, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self._blocked: set[str] = set()
        self._delay: dict[str, float] = {}  # address or host or "*" -> seconds
        self._loss: dict[str, float] = {}  # address or host or "*" -> probability
        self.counters: collections.Counter[str] = collections.Counter()

    # -- changing the plan -------------------------------------------------------------

    def partition(self, *addresses: str) -> None:
        """Drop all traffic to and from these addresses (or hosts) until healed."""
        self._blocked.update(addresses)

    def heal(self, *addresses: str) -> None:
        """Lift the partition for these addresses, or for all when none are named."""
        if addresses:
            self._blocked.difference_update(addresses)
        else:
            self._blocked.clear()

    def delay(self, seconds: float, *addresses: str) -> None:
        """Hold frames to these addresses (all when none named) ``seconds`` before sending; 0 clears."""
        for key in addresses or ("*",):
            if seconds > 0:
                self._delay[key] = seconds
            else:
                self._delay.pop(key, None)

    def lose(self, probability: float, *addresses: str) -> None:
        """Silently drop this fraction of frames to these addresses (all when none named)."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError("a loss probability is between 0 and 1")
        for key in addresses or ("*",):
            if probability > 0:
                self._loss[key] = probability
            else:
                self._loss.pop(key, None)

    def clear(self) -> None:
        """No faults at all."""
        self._blocked.clear()
        self._delay.clear()
        self._loss.clear()

    def apply_spec(self, spec: Mapping[str, Any]) -> None:
        """Replace every fault with the ones ``spec`` describes (the JSON of :func:`watch_fault_file`)::

            {"partition": ["127.0.0.1:7001", ...],        # no traffic to these (or hosts)
             "delay": {"127.0.0.1:7002": 0.3, "*": 0.0},  # seconds before each frame leaves
             "loss": {"*": 0.05}}                         # fraction of frames silently lost

        Raises ``ValueError`` for anything else, leaving the plan as it was.
        """
        if not isinstance(spec, Mapping) or set(spec) - {"partition", "delay", "loss"}:
            raise ValueError("a fault spec is a map with partition, delay and loss")
        blocked = spec.get("partition") or []
        delay, loss = spec.get("delay") or {}, spec.get("loss") or {}
        if not isinstance(blocked, list) or not all(isinstance(a, str) for a in blocked):
            raise ValueError("partition: a list of addresses")
        for name, table, top in (("delay", delay, 3600.0), ("loss", loss, 1.0)):
            if not isinstance(table, Mapping) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and 0 <= v <= top for k, v in table.items()
            ):
                raise ValueError(f"{name}: a map of address to a number in [0, {top:g}]")
        self.clear()
        self.partition(*blocked)
        for key, seconds in delay.items():
            self.delay(float(seconds), key)
        for key, probability in loss.items():
            self.lose(float(probability), key)

    def describe(self) -> dict[str, Any]:
        """The plan as a spec (what :meth:`apply_spec` takes)."""
        return {"partition": sorted(self._blocked), "delay": dict(self._delay), "loss": dict(self._loss)}

    # -- consulting it -----------------------------------------------------------------

    def is_blocked(self, address: str) -> bool:
        return bool(self._blocked) and (address in self._blocked or _host(address) in self._blocked)

    def outgoing(self, address: str) -> Verdict:
        """The fate of one frame we are about to send to ``address``."""
        if not (self._blocked or self._delay or self._loss):
            return _PASS
        if self.is_blocked(address):
            self.counters["blocked_out"] += 1
            return Verdict(blocked=True)
        delay = self._lookup(self._delay, address, 0.0)
        loss = self._lookup(self._loss, address, 0.0)
        lost = loss > 0 and self.rng.random() < loss
        if lost:
            self.counters["lost"] += 1
        if delay:
            self.counters["delayed"] += 1
        return Verdict(lost=lost, delay=delay)

    def blocks_incoming(self, address: str) -> bool:
        """Should a frame arriving from ``address`` (the TCP peer) be refused?"""
        if self.is_blocked(address):
            self.counters["blocked_in"] += 1
            return True
        return False

    @staticmethod
    def _lookup(table: dict[str, float], address: str, default: float) -> float:
        if not table:
            return default
        for key in (address, _host(address), "*"):
            if key in table:
                return table[key]
        return default


async def watch_fault_file(plan: FaultPlan, path: str, *, interval: float = 0.1) -> None:
    """Keep ``plan`` equal to the JSON spec in ``path`` (see :meth:`FaultPlan.apply_spec`).

    A test hook for real processes: a test rewrites the file (write a temporary file, then
    rename it over) and the daemon follows within ``interval``. A missing file means no
    faults; a malformed one is logged and the previous plan kept.
    """
    seen: tuple[int, int] | None = None
    while True:
        try:
            st = os.stat(path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp != seen:
            seen = stamp
            if stamp is None:
                plan.clear()
                log.warning("mesh faults: %s is gone, no faults", path)
            else:
                try:
                    with open(path, encoding="utf-8") as f:
                        plan.apply_spec(json.load(f))
                except (OSError, ValueError) as exc:
                    log.error("mesh faults: %s ignored: %s", path, exc)
                else:
                    plan.counters["specs_loaded"] += 1
                    log.warning("mesh faults from %s: %s", path, plan.describe())
        await trio.sleep(interval)
