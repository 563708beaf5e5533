"""The data-dir lock: one process at a time owns a data dir's database and indexes.

``flock`` on ``node.lock`` is released by the kernel when its holder dies, even by
SIGKILL, so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from .errors import Unavailable

__all__ = ["DataDirLock"]


class DataDirLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, timeout: float = 0.0) -> "DataDirLock":
        """Take the lock, waiting up to ``timeout`` seconds; Unavailable if another process keeps it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise Unavailable(
                        f"another Hyphae process is using {self.path.parent} (it holds {self.path.name})"
                    ) from None
                time.sleep(0.02)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "DataDirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
