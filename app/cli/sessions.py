"""Sessions and scenes as ``$HYPHAE_API_KEY``'s agent: the CLI twins of ``start_session``,
``end_session``, ``get_scene`` and ``list_scenes``."""

from __future__ import annotations

import argparse
import sys

from .plumbing import EXIT_OK, act, emit_json, format_time

__all__ = ["cmd_scene_get", "cmd_scene_list", "cmd_session_end", "cmd_session_start"]


def cmd_session_start(args: argparse.Namespace) -> int:
    fields = {"project": args.project, "title": args.title}
    result = act(args, "start_session", **{k: v for k, v in fields.items() if v is not None})
    if args.json:
        emit_json(result)
        return EXIT_OK
    print(f"Session open in project {args.project!r}; its scene is {result['scene_id']}.", file=sys.stderr)
    print("Memories you store go to it until `hyphae session end` with the id below:", file=sys.stderr)
    print(result["session_id"])
    return EXIT_OK


def cmd_session_end(args: argparse.Namespace) -> int:
    result = act(args, "end_session", session_id=args.session_id)
    if args.json:
        emit_json(result)
    else:
        print(f"Session {result['session_id']} ended {format_time(result['ended_at'])}: {result['cell_count']} memories.")
    return EXIT_OK


def _scene_line(scene: dict) -> str:
    state = f"ended {format_time(scene['ended_at'])}" if scene.get("ended_at") else "open"
    title = f"  {scene['title']}" if scene.get("title") else ""
    return f"{scene['scene_id']}  {scene['project'] or '-':<16} {scene['cell_count']:>4} cells  {state}{title}"


def cmd_scene_get(args: argparse.Namespace) -> int:
    scene = act(args, "get_scene", scene_id=args.scene_id)
    if args.json:
        emit_json(scene)
        return EXIT_OK
    print(_scene_line(scene))
    print(f"  started {format_time(scene['created_at'])} by agent {scene['agent_id']}")
    if scene.get("summary_node_id"):
        print(f"  consolidated {format_time(scene['consolidated_at'])} as {scene['summary_node_id']} (L2)")
    for node_id in scene["cell_ids"]:
        print(f"  {node_id}")
    return EXIT_OK


def cmd_scene_list(args: argparse.Namespace) -> int:
    fields = {"project": args.project, "limit": args.limit, "cursor": args.cursor}
    result = act(args, "list_scenes", **{k: v for k, v in fields.items() if v is not None})
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["scenes"]:
        print("No scenes yet: `hyphae session start --project P` opens one.")
    for scene in result["scenes"]:
        print(_scene_line(scene))
    if result.get("next_cursor"):
        print(f"more: hyphae scene list --cursor {result['next_cursor']}")
    return EXIT_OK
