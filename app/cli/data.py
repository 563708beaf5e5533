"""Moving data: export and import (JSONL, or the official memory server's graph) and reindex."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from .plumbing import (
    EXIT_AUTH, EXIT_FAILED, EXIT_OK, EXIT_USAGE, NO_DAEMON, CliError, admin_call, emit_json, in_process,
    progress_bar, refuse_while_running,
)  # fmt: skip

def cmd_export(args: argparse.Namespace) -> int:
    from node.transfer import export_file

    path = Path(args.file).resolve()
    counts = admin_call(args, "/v1/admin/export", {"path": str(path)})
    if counts is NO_DAEMON:
        with progress_bar(args, "exporting") as bar:
            counts = in_process(args, lambda service: export_file(service, path, progress=bar.update))
        counts = {"file": str(path), **counts}
    if args.json:
        emit_json(counts)
    else:
        print(f"Exported {counts['cells']} cells, {counts['beacons']} beacons and {counts['scenes']} scenes to {path}.")
    return EXIT_OK


def _line_error(path: Path) -> Callable[[int, str], None]:
    def report(line: int, reason: str) -> None:
        print(f"{path}:{line}: {reason}", file=sys.stderr)

    return report


def cmd_import(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"no such file: {path}", EXIT_USAGE)
    if args.source == "memory-server":
        report = _import_memory_graph(args, path)
        summary = f"Imported {report['entities']} entities and {report['relations']} relations from {path}"
    else:
        from node.transfer import import_file

        report = admin_call(args, "/v1/admin/import", {"path": str(path.resolve())})
        if report is NO_DAEMON:
            with progress_bar(args, "importing") as bar:
                report = in_process(args, lambda service: import_file(service, path, progress=bar.update, on_error=_line_error(path)))
        elif not args.json:
            for error in report["errors"]:
                _line_error(path)(error["line"], error["reason"])
        resumed = f" (resumed at line {report['resumed_at_line']})" if report["resumed_at_line"] else ""
        summary = (
            f"Imported {path}{resumed}: {report['stored']} new cells, {report['known']} already here, "
            f"{report['scenes']} scenes, {report['beacons']} new beacons"
        )
    if args.json:
        emit_json(report)
    else:
        errors = report["error_count"]
        print(summary + (f"; {errors} bad lines skipped (listed above)." if errors else "."))
    return EXIT_FAILED if report["error_count"] else EXIT_OK


def _import_memory_graph(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """The memory server's graph, stored as $HYPHAE_API_KEY's agent (through the daemon if one runs)."""
    from ..client import DaemonClient, running_daemon
    from node.memory_graph import import_memory_graph

    api_key = os.environ.get("HYPHAE_API_KEY", "")
    if not api_key:
        raise CliError("HYPHAE_API_KEY is not set: the graph is stored as an agent; create one with `hyphae agent add NAME`", EXIT_AUTH)
    info = running_daemon(args.home)
    with progress_bar(args, "importing") as bar:
        if info is not None:
            client = DaemonClient(args.home, info, api_key)
            try:
                async def store(fields):
                    return await trio.to_thread.run_sync(lambda: client.call("POST", "/v1/cells", json=fields))

                return trio.run(lambda: import_memory_graph(path, store, progress=bar.update, on_error=_line_error(path)))
            finally:
                client.close()

        async def run(service):
            principal = await service.authenticate(api_key)
            return await import_memory_graph(
                path, lambda fields: service.store(principal, **fields), progress=bar.update, on_error=_line_error(path)
            )

        return in_process(args, run)


def cmd_reindex(args: argparse.Namespace) -> int:
    from node.reindex import reindex

    refuse_while_running(args, "reindex")
    with progress_bar(args, "reindexing") as bar:
        result = trio.run(lambda: reindex(args.home, rebuild=args.rebuild, progress=lambda what, done, total: bar.update(done, total, what)))
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["rebuilt"]:
        print(f"Everything is already in {result['embedding_space']}; nothing to do (--rebuild rebuilds the indexes anyway).")
    else:
        print(f"Re-embedded {result['cells']} cells and {result['beacons']} beacons into {result['embedding_space']}; indexes rebuilt.")
    return EXIT_OK


# -- plumbing ----------------------------------------------------------------------

# How each facade call travels when a daemon runs: (HTTP method, path).


