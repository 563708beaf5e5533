"""LAN discovery with zeroconf: publish ``_hyphae._tcp.local.`` and browse for peers.

The TXT record carries the node id (``node``), the team id *hash* (``team``, never
the key), the protocol version (``proto``) and the mesh port (``port``). A service
with another team hash or protocol, or our own node id, is ignored; a team mate's on another
protocol is also logged, once per node ("... speaks mesh protocol 1, this node 2: upgrade it"),
since neither end will ever contact the other; every other one is proposed through ``on_peer(address, node_id)`` on the trio thread. Discovery only
*proposes*: the engine contacts the address, and membership proofs and signatures
decide whether it is a peer. A TXT record is trivially forged, so nothing here is
trusted beyond "worth a try".

python-zeroconf is thread-based: the :class:`Zeroconf` object runs its own event
loop thread, and a :class:`ServiceBrowser` calls our handler from its thread. Blocking
calls (start, register, unregister, close) run in ``trio.to_thread``; the browser
thread resolves a service (a blocking query, fine there) and hands the result to trio
with ``TrioToken.run_sync_soon``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import trio
from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

from .transport import PROTOCOL_VERSION

__all__ = ["Discovery", "SERVICE_TYPE"]

log = logging.getLogger("hyphae.mesh.discovery")

SERVICE_TYPE = "_hyphae._tcp.local."
_RESOLVE_TIMEOUT_MS = 3000
_MAX_OUTDATED = 64  # team mates on another protocol remembered (and logged) at most; a TXT record is easily forged


class Discovery:
    """Register this node and browse for team mates until cancelled.

    ``addresses`` are the IPv4 addresses we publish, preferred first; a peer reports the
    first one it resolves. ``interfaces`` limits the multicast interfaces (all when None).
    ``peers`` maps the node ids currently published by team mates to their address.
    """

    def __init__(
        self, *, node_id: str, team_hash: str, port: int, addresses: list[str] | None = None,
        on_peer: Callable[[str, str], None], interfaces: list[str] | None = None, protocol: int = PROTOCOL_VERSION,
    ) -> None:  # fmt: skip
        self.node_id = node_id
        self.team_hash = team_hash
        self.port = port
        self.addresses = list(addresses or ["127.0.0.1"])
        self.on_peer = on_peer
        self.interfaces = interfaces
        self.protocol = protocol
        self.peers: dict[str, str] = {}
        self.ignored = 0  # services seen with another team, protocol, or unreadable records
        self.outdated: dict[str, str] = {}  # node id -> what was logged, for team mates on another protocol
        self.error: str | None = None  # why zeroconf could not start, if it could not
        self._names: dict[str, str] = {}  # service name -> node id
        self._token: trio.lowlevel.TrioToken | None = None
        self._active = False

    @property
    def service_name(self) -> str:
        return f"hyphae-{self.node_id}.{SERVICE_TYPE}"

    def service_info(self) -> ServiceInfo:
        """What we publish."""
        return ServiceInfo(
            SERVICE_TYPE, self.service_name,
            addresses=[socket.inet_aton(a) for a in self.addresses], port=self.port,
            properties={
                "node": self.node_id, "team": self.team_hash, "proto": str(self.protocol), "port": str(self.port),
            },
            server=f"hyphae-{self.node_id}.local.",
        )  # fmt: skip

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register and browse until cancelled; unregister on the way out.

        When zeroconf cannot start (no multicast-capable interface, the port refused),
        the error is logged and kept in :attr:`error`, and this waits for cancellation:
        a node without LAN discovery still runs on its static peers.
        """
        self._token = trio.lowlevel.current_trio_token()
        info = self.service_info()
        interfaces = self.interfaces if self.interfaces is not None else "all"
        try:
            zc = await trio.to_thread.run_sync(self._open, interfaces)
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("zeroconf discovery unavailable (%s); static peers only", self.error)
            task_status.started()
            await trio.sleep_forever()
        browser: ServiceBrowser | None = None
        registered = False
        self._active = True
        try:
            # Browse first, so peers are found while our own name is being probed (~1.5 s).
            browser = await trio.to_thread.run_sync(
                lambda: ServiceBrowser(zc, SERVICE_TYPE, handlers=[self._on_change])
            )
            await trio.to_thread.run_sync(zc.register_service, info)
            registered = True
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._active = False
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close, zc, browser, info if registered else None)

    def _open(self, interfaces: list[str] | str) -> Zeroconf:
        from zeroconf import InterfaceChoice

        return Zeroconf(
            interfaces=InterfaceChoice.All if interfaces == "all" else interfaces, ip_version=IPVersion.V4Only
        )

    @staticmethod
    def _close(zc: Zeroconf, browser: ServiceBrowser | None, info: ServiceInfo | None) -> None:
        try:
            if browser is not None:
                browser.cancel()
            if info is not None:
                zc.unregister_service(info)  # goodbye packets: peers drop us from their caches
        finally:
            zc.close()

    # -- the browser thread -------------------------------------------------------------

    def _on_change(self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if not self._active or name == self.service_name:
            return
        if state_change is ServiceStateChange.Removed:
            self._to_trio(self._lost, name)
            return
        info = zeroconf.get_service_info(service_type, name, timeout=_RESOLVE_TIMEOUT_MS)
        found = self._read(info) if info is not None else None
        if found is None:
            self._to_trio(self._ignore)
            return
        self._to_trio(self._found, name, *found)

    def _read(self, info: ServiceInfo) -> tuple[str, str] | None:
        """``(address, node_id)`` of a team mate's record, or None."""
        props = {
            (k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)):
            (v.decode("utf-8", "replace") if isinstance(v, bytes) else "")
            for k, v in (info.properties or {}).items()
        }  # fmt: skip
        node_id = props.get("node", "")
        if props.get("team") != self.team_hash:
            return None
        if props.get("proto") != str(self.protocol):
            self._other_protocol(node_id, props.get("proto", "?"), info)
            return None
        if not node_id or node_id == self.node_id:
            return None
        addresses = info.parsed_addresses(IPVersion.V4Only)
        port = info.port
        if not addresses or not port:
            return None
        return f"{addresses[0]}:{port}", node_id

    def _other_protocol(self, node_id: str, protocol: str, info: ServiceInfo) -> None:
        """A record under our team's hash on another protocol: say so, once per node (bounded)."""
        if not node_id or node_id in self.outdated or len(self.outdated) >= _MAX_OUTDATED:
            return
        where = ", ".join(info.parsed_addresses(IPVersion.V4Only)) or "the LAN"
        verb = "upgrade it" if protocol.isdigit() and int(protocol) < self.protocol else "upgrade this node"
        message = (f"team mate {node_id} at {where} speaks mesh protocol {protocol}, this node {self.protocol}: "
                   f"{verb} (the two cannot exchange memories until then)")  # fmt: skip
        self.outdated[node_id] = message
        log.warning("%s", message)

    def _to_trio(self, fn: Callable[..., None], *args: object) -> None:
        token = self._token
        if token is None:
            return
        try:
            token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass

    # -- on the trio thread -------------------------------------------------------------

    def _found(self, name: str, address: str, node_id: str) -> None:
        if not self._active:
            return
        self._names[name] = node_id
        self.peers[node_id] = address
        try:
            self.on_peer(address, node_id)
        except Exception:
            log.exception("on_peer failed for %s at %s", node_id, address)

    def _lost(self, name: str) -> None:
        node_id = self._names.pop(name, None)
        if node_id is not None:
            self.peers.pop(node_id, None)

    def _ignore(self) -> None:
        self.ignored += 1
