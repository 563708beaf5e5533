"""Creating and opening a data dir: what ``hyphae init`` does, and what every command needs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from mesh.identity import NodeIdentity

from node.config import NodeConfig, load_config, write_initial_config
from node.data_dir import require_database
from node.lock import DataDirLock
from node.service import MemoryService
from node.store import create_database

__all__ = ["init_home", "open_node"]


def init_home(home: Path) -> tuple[NodeConfig, bool]:
    """Create the data dir, config, node key and database; returns (config, created)."""
    created = not (home / "config.toml").exists()
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    if created:
        write_initial_config(home)
    config = load_config(home)
    require_database(config)  # a node key without its database: restore it, never re-create it
    if not config.key_path.exists():
        NodeIdentity.generate().save(config.key_path)
    create_database(config.db_path)
    return config, created


@contextlib.asynccontextmanager
async def open_node(home: Path, *, lock_timeout: float = 10.0, **service_options) -> AsyncIterator[MemoryService]:
    """Own the data dir (its lock) and open the memory service in it."""
    config = load_config(home)
    lock = DataDirLock(config.lock_path)
    await trio.to_thread.run_sync(lock.acquire, lock_timeout)
    try:
        service = await MemoryService.open(config, **service_options)
        try:
            yield service
        finally:
            await service.aclose()
    finally:
        lock.release()
