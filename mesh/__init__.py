"""The gossip mesh: identity, wire format, a sans-IO engine, and its runtimes."""

from .identity import NodeIdentity, node_id_for

__all__ = ["NodeIdentity", "node_id_for"]
