"""Instructions per recall over HTTP: a figure the machine's load does not move.

On a shared 2-core machine CPU-time per call swings by ±30% with the neighbours' load, which
hides any change smaller than that. Counting instructions does not: the daemon runs under
valgrind's callgrind, the counters are zeroed after a warm-up, exactly ``--requests`` recalls
(query vectors cached) arrive over 8 keep-alive raw-socket connections, and the user-space
instructions the daemon's threads executed are divided by the number of requests.

    python benchmarks/mcp_instructions.py --code ../baseline-checkout --code .   # before / after, one data dir
    python benchmarks/mcp_instructions.py --floor                      # the no-op app alone
    python benchmarks/mcp_instructions.py --code . --servers lean,hypercorn --floor   # each server

Each ``--code`` is a checkout whose ``node``/``mcp_bridge`` the daemon imports (``PYTHONPATH``),
so two versions answer from copies of the same pre-filled data dir. Caveats: kernel work (the
socket syscalls) is not counted, and memory stalls (the HNSW search is bound by them) cost
time but no instructions; this is a figure for interpreter work, beside the CPU-time ones of
``mcp_bench.py``. Needs ``valgrind``; each daemon takes minutes to start under it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mcp_bench as mb  # noqa: E402

VALGRIND = ("valgrind", "--tool=callgrind", "--dump-instr=no", "--collect-jumps=no")


async def send_recalls(url: str, key: str, count: int, clients: int = 8) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    numbers = iter(range(count))

    async def client() -> None:
        connection = mb.RawConnection(await trio.open_tcp_stream(host, int(port)), f"{host}:{port}", key)
        async with connection.stream:
            for i in numbers:
                body = await connection.post(mb.recall_hit(i))
                if b'"result"' not in body:
                    raise RuntimeError(body[:300])

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)


def _total_instructions(path: str) -> int:
    for line in open(path):
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line")


def count(process: subprocess.Popen, url: str, key: str, requests: int, out: Path) -> float:
    """Instructions per request of ``process`` (under callgrind, writing to ``out``)."""
    trio.run(send_recalls, url, key, 80)  # warm-up: query vectors cached, code paths taken once
    subprocess.run(["callgrind_control", "-z", str(process.pid)], check=True, capture_output=True)
    trio.run(send_recalls, url, key, requests)
    subprocess.run(["callgrind_control", "-d", str(process.pid)], check=True, capture_output=True)
    latest = max(glob.glob(f"{out}.*"), key=os.path.getmtime)
    return _total_instructions(latest) / requests


def run_daemon(code: Path, template: Path, key: str, root: Path, requests: int, server: str | None = None) -> float:
    home = root / "home"
    shutil.copytree(template, home)
    out = root / "callgrind.out"
    log = open(root / "daemon.log", "wb")
    process = subprocess.Popen([*VALGRIND, f"--callgrind-out-file={out}", sys.executable, "-m", "app.cli",
                                "--home", str(home), "up"], cwd=code, env={**mb.server_env(server), "PYTHONPATH": str(code)},
                               stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 1800
        while not (home / "daemon.json").exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start under valgrind: see {root / 'daemon.log'}")
            time.sleep(1)
        time.sleep(1)  # daemon.json is written whole, but give the reader a settled file
        url = json.loads((home / "daemon.json").read_text())["api_url"]
        return count(process, url, key, requests, out)
    finally:
        process.terminate()
        try:
            process.wait(300)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_floor(root: Path, requests: int, server: str | None = None) -> float:
    out = root / "callgrind.out"
    process = subprocess.Popen([*VALGRIND, f"--callgrind-out-file={out}", sys.executable, mb.__file__,
                                "--serve-noop"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               env=mb.server_env(server))
    try:
        url = f"http://127.0.0.1:{int(process.stdout.readline())}"
        return count(process, url, "unused", requests, out)
    finally:
        process.terminate()
        process.wait(300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", type=Path, action="append", default=[], help="a checkout to measure (repeatable)")
    parser.add_argument("--floor", action="store_true", help="also the no-op app on each server")
    parser.add_argument("--servers", default="", help="HTTP servers to run each checkout on, comma-separated "
                        "(lean, hypercorn; default: the checkout's default)")
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    names = [name.strip() for name in args.servers.split(",") if name.strip()] or [None]
    root = Path(tempfile.mkdtemp(prefix="hyphae-mcp-instructions-"))
    figures: dict[str, float] = {}
    try:
        if args.code:
            node = mb.Node(root, "hashed")  # pre-filled natively, then stopped and copied per checkout
            try:
                mb.prefill(node, args.cells)
            finally:
                node.stop()
            for i, (code, name) in enumerate((code, name) for code in args.code for name in names):
                run_root = root / f"run-{i}"
                run_root.mkdir()
                label = str(code.resolve()) if name is None else f"{code.resolve()} on {name}"
                figures[label] = run_daemon(code.resolve(), node.home, node.key, run_root, args.requests, name)
                print(f"{label}: {figures[label] / 1e6:.3f} M instructions per recall", flush=True)
        if args.floor:
            for name in names:
                label = f"no-op app on {name or 'the default server'}"
                (root / f"floor-{name}").mkdir()
                figures[label] = run_floor(root / f"floor-{name}", args.requests, name)
                print(f"{label}: {figures[label] / 1e6:.3f} M instructions per request", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({name: round(value) for name, value in figures.items()}, indent=2))


if __name__ == "__main__":
    main()
