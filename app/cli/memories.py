"""Memories as the agent whose key is in ``HYPHAE_API_KEY``: store, recall, inbox, beacons, scenes."""

from __future__ import annotations

import argparse
import json
import sys

from .plumbing import EXIT_OK, act, emit_json, format_time, one_line

def cmd_store(args: argparse.Namespace) -> int:
    content = sys.stdin.read() if args.text == "-" else args.text
    metadata = json.loads(args.metadata) if args.metadata else None
    if args.supersedes:
        metadata = {**(metadata or {}), "supersedes": args.supersedes}
    source_ref = None
    if args.ref:
        kind, _, locator = args.ref.partition(":")
        source_ref = {"kind": kind, "locator": locator}
    fields = {
        "content": content,
        "cell_type": args.type,
        "salience": args.salience,
        "project": args.project,
        "scene_id": args.scene,
        "source_ref": source_ref,
        "metadata": metadata,
        "idempotency_key": args.idempotency_key,
    }
    result = act(args, "store", **{k: v for k, v in fields.items() if v is not None})
    if args.json:
        emit_json(result)
    else:
        print(result["node_id"])
    return EXIT_OK


def cmd_recall(args: argparse.Namespace) -> int:
    fields = {"query": args.query, "k": args.k, "layer": args.layer, "cell_types": args.type, "project": args.project,
              "include_superseded": args.include_superseded or None}  # fmt: skip
    result = act(args, "search", **{k: v for k, v in fields.items() if v is not None})
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["results"]:
        print("No memories match.")
    for hit in result["results"]:
        status = "" if hit.get("status", "active") == "active" else f" ({hit['status']})"
        print(f"{hit['distance']:.3f}  [{hit['cell_type']}]{status} {one_line(hit['content'])}")
        print(f"       {hit['node_id']}  {format_time(hit['created_at'])}")
    return EXIT_OK


def cmd_inbox(args: argparse.Namespace) -> int:
    every = {"include_superseded": True} if args.include_superseded else {}
    if args.pull:
        result = act(args, "pull_inbox", **({"limit": args.limit} if args.limit else {}), **every)
    else:
        since = int(args.since) if args.since and args.since.isdigit() else args.since
        result = act(args, "inbox", since=since, limit=args.limit, **every)
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["diffs"]:
        print("Inbox is empty.")
    for diff in result["diffs"]:
        print(f"{format_time(diff['received_at'])}  sim={diff['similarity']:.2f}  [{diff['cell_type']}] {one_line(diff['content'])}")
        print(f"       {diff['node_id']} from {diff['source_agent']} @ {diff['origin_node'][:12]} hops={diff['hops']}")
        if diff.get("kind") == "supersedes":
            print(f"       supersedes {diff['related']}, which you received: that one is no longer current")
        elif diff.get("kind") == "possible_conflict":
            print(f"       possible conflict with your {diff['related']}")
    return EXIT_OK


def cmd_consolidate(args: argparse.Namespace) -> int:
    result = act(args, "consolidate_scene", scene_id=args.scene_id)
    if args.json:
        emit_json(result)
    else:
        print(f"Scene {result['scene_id']}: {result['source_count']} cells summarised as {result['node_id']} (L2)")
    return EXIT_OK


def cmd_beacon_add(args: argparse.Namespace) -> int:
    fields = {
        "query": args.query,
        "threshold": args.threshold,
        "cell_types": args.type,
        "project": args.project,
        "min_salience": args.min_salience,
        "ttl_seconds": args.ttl,
    }
    result = act(args, "place_beacon", **{k: v for k, v in fields.items() if v is not None})
    if args.json:
        emit_json(result)
    else:
        print(result["beacon_id"])
    return EXIT_OK


def cmd_beacon_list(args: argparse.Namespace) -> int:
    result = act(args, "list_beacons")
    if args.json:
        emit_json(result)
        return EXIT_OK
    if not result["beacons"]:
        print('No beacons: `hyphae beacon add "what you want to hear about"`.')
    for beacon in result["beacons"]:
        types = ",".join(beacon.get("cell_types") or []) or "any type"
        print(f"{beacon['beacon_id']}  τ={beacon['threshold']:.2f}  {types:<16} {one_line(beacon['query'], 70)}")
    return EXIT_OK


def cmd_beacon_remove(args: argparse.Namespace) -> int:
    result = act(args, "remove_beacon", beacon_id=args.beacon_id)
    if args.json:
        emit_json(result)
    else:
        print(f"Removed beacon {result['beacon_id']}.")
    return EXIT_OK


