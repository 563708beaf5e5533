"""One run's nodes on several processes, each running ahead as far as the others allow.

A run of the production engine is one event queue, and at N=10,000 a quarter of an hour of
one core. Split by node index (node ``i`` lives in process ``i % K``), each process runs the
queue of its own nodes; a frame to a node elsewhere waits in ``SimNetwork.remote``. No frame
arrives sooner than the link model's least latency ``L`` after it left, so a process may run
to ``L`` past the virtual time the slowest other process last said it had reached (a
conservative parallel simulation). Each runs in steps of ``L/5``, and after each sends the
others how far it got and the frames for their nodes sent meanwhile: so none waits on the
others' whole window (lock-step windows of ``L`` left both processes idle ~9 % of a run,
each waiting out the other's share of each window).

Events are ordered by time and cause (:class:`~simulations.network.SimNetwork`), and each
sender draws its frames' fates from its own generator, so the result does not depend on how
the nodes are split: a run gives the same summary byte for byte on one process or on K.
"""

from __future__ import annotations

import multiprocessing
import resource
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from queue import SimpleQueue
from typing import Any, Protocol

from .network import SimNetwork, index_of

__all__ = ["Shard", "Shards", "ShardError", "open_shards"]


class ShardError(RuntimeError):
    """A process of a split run failed; the message holds its traceback."""


class Shard:
    """One process's part of a run: a :class:`SimNetwork` holding some of the nodes, and the
    pipes to the other parts (none when it holds them all)."""

    def __init__(self, net: SimNetwork, index: int, count: int, lookahead_ms: int) -> None:
        self.net = net
        self.index = index
        self.count = count
        self.lookahead_ms = lookahead_ms
        self.peers: dict[int, Connection] = {}  # the other parts, by index
        self._heard: dict[int, tuple[int, int]] | None = None  # set up on the first run with peers
        self._call = 0  # run_until calls so far: every part gets the same ones
        self._outboxes: dict[int, SimpleQueue] = {}

    def owns(self, node: int) -> bool:
        return node % self.count == self.index

    def run_until(self, until_ms: int) -> None:
        """Run to ``until_ms`` (every part is asked to, call for call)."""
        if not self.peers:
            self.net.run_until(until_ms)
            return
        net = self.net
        if self._heard is None:
            self._start_links()
        self._call += 1
        start = net.now
        self._tell(start)  # and with it what this part sent between calls (the boot's frames)
        step = max(1, self.lookahead_ms // 5)
        while net.now < until_ms:
            # Every part's frames reach ours no sooner than L after it sent them, so we may run
            # to L past where the slowest part last said it was: no lock-step, each runs ahead
            # while it can. A part not yet heard in this call may still send frames of `start`.
            horizon = self.lookahead_ms + min(
                now if call == self._call else start - 1 for call, now in self._heard.values()
            )
            if horizon <= net.now:
                self._take(block=True)
                continue
            net.run_until(min(until_ms, horizon, net.now + step))
            self._tell(net.now)
            self._take(block=False)

    def _start_links(self) -> None:
        self._heard = dict.fromkeys(self.peers, (0, self.net.now))  # (call, virtual time) each last said
        # A sender thread per part: a send that fills the pipe then waits in that thread, never
        # in ours, so two parts sending each other much at once cannot wait on each other.
        # The thread waits for the interpreter lock while ours runs the engines: a short switch
        # interval lets it write a step's word within ~0.5 ms, not 5, when another part waits on it.
        sys.setswitchinterval(0.0005)
        for j, conn in self.peers.items():
            queue: SimpleQueue = SimpleQueue()
            threading.Thread(target=_send_all, args=(conn, queue), name=f"to-part-{j}", daemon=True).start()
            self._outboxes[j] = queue

    def _tell(self, now: int) -> None:
        """Send each part how far we have run and the frames for its nodes sent meanwhile."""
        remote = self.net.take_remote()
        if len(self.peers) == 1:  # two parts: all of it goes to the other
            out = dict.fromkeys(self.peers, remote)
        else:
            out = {j: [] for j in self.peers}
            for entry in remote:
                out[index_of(entry[2]) % self.count].append(entry)
        for j, queue in self._outboxes.items():
            # Pickled here: the sender thread then needs the interpreter only briefly to write.
            queue.put(ForkingPickler.dumps((self._call, now, out[j])))

    def _take(self, block: bool) -> None:
        """What the other parts sent: all that has come, or (``block``) at least the word of
        the part furthest behind."""
        heard = self._heard
        if block:
            slowest = min(heard, key=lambda j: (heard[j], j))  # (call, time): the furthest behind
            self._take_one(slowest)
        for j, conn in self.peers.items():
            while conn.poll():
                self._take_one(j)

    def _take_one(self, j: int) -> None:
        call, now, entries = self.peers[j].recv()
        self._heard[j] = (call, now)
        if entries:
            self.receive(entries)

    def receive(self, entries: list[list]) -> None:
        """Frames from the other parts, for our nodes."""
        self.net.put_remote(entries)

    def peak_rss_kb(self) -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class Shards(Protocol):
    """The parts of a run, asked as one: :meth:`call` runs a method on each, in index order,
    and returns what each returned; :meth:`close` lets them go."""

    def call(self, method: str, *args: Any) -> list[Any]: ...

    def close(self) -> None: ...


class _Local:
    """The one part of a run, in this process."""

    def __init__(self, shard: Shard) -> None:
        self._shard = shard

    def call(self, method: str, *args: Any) -> list[Any]:
        return [getattr(self._shard, method)(*args)]

    def close(self) -> None:
        pass


class _Forked:
    """One process per part, forked (they share the workload as it stands; nothing is pickled
    but the calls, their answers and the frames between parts)."""

    def __init__(self, count: int, make: Callable[[int, int], Shard]) -> None:
        mp = multiprocessing.get_context("fork")
        pairs = {(i, j): mp.Pipe() for i in range(count) for j in range(i + 1, count)}
        commands = [mp.Pipe() for _ in range(count)]
        every = [c for ends in pairs.values() for c in ends] + [c for ends in commands for c in ends]
        self._procs = []
        for i in range(count):
            peers = {j: ends[0] for (a, j), ends in pairs.items() if a == i}
            peers.update({a: ends[1] for (a, j), ends in pairs.items() if j == i})
            mine = [*peers.values(), commands[i][1]]
            proc = mp.Process(
                target=_serve, args=(make, i, count, commands[i][1], peers, [c for c in every if c not in mine]),
                name=f"simulation-part-{i}", daemon=True,
            )  # fmt: skip
            proc.start()
            self._procs.append(proc)
        # Only the parts hold their ends: a part that dies then closes its pipes, and whoever
        # waits on it hears so instead of waiting for ever.
        for conn in every:
            if not any(conn is ends[0] for ends in commands):
                conn.close()
        self._conns = [ends[0] for ends in commands]

    def call(self, method: str, *args: Any) -> list[Any]:
        for conn in self._conns:
            conn.send((method, args))
        results, failures = [], []
        for i, conn in enumerate(self._conns):
            try:
                status, value = conn.recv()
            except (EOFError, OSError):
                self._procs[i].join(5)
                status, value = "error", f"the process exited (code {self._procs[i].exitcode})"
            if status == "error":
                failures.append(f"part {i}: {value}")
            results.append(value)
        if failures:
            self.close()
            raise ShardError(f"{method} failed in a process of the run:\n" + "\n".join(failures))
        return results

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self._conns:
            conn.close()


def _serve(
    make: Callable[[int, int], Shard], index: int, count: int, conn: Connection, peers: dict[int, Connection],
    others: list[Connection],
) -> None:
    for other in others:  # the ends this process inherited but does not own
        other.close()
    try:
        shard = make(index, count)
        shard.peers = peers
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        method, args = message
        try:
            conn.send(("ok", getattr(shard, method)(*args)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            return


def _send_all(conn: Connection, queue: SimpleQueue) -> None:
    while True:
        try:
            conn.send_bytes(queue.get())
        except (OSError, ValueError):  # the other part has gone: the run is failing anyway
            return


def open_shards(count: int, make: Callable[[int, int], Shard]) -> Shards:
    """The parts of a run: ``make(index, count)`` builds each (in its own process when
    ``count`` > 1, else here)."""
    if count <= 1:
        return _Local(make(0, 1))
    return _Forked(count, make)
