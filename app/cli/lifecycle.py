"""Knowledge that stays true (node.lifecycle): ``hyphae validate`` re-checks file-sourced cells."""

from __future__ import annotations

import argparse

from .plumbing import EXIT_OK, NO_DAEMON, admin_call, emit_json, in_process


def cmd_validate(args: argparse.Namespace) -> int:
    body = {"project": args.project} if args.project else {}
    result = admin_call(args, "/v1/admin/validate", body)
    if result is NO_DAEMON:
        result = in_process(args, lambda service: service.validate_sources(**body))
    if args.json:
        emit_json(result)
        return EXIT_OK
    print(f"Checked {result['checked']} cells whose source is a file on this machine.")
    for stale in result["stale"]:
        print(f"  stale  {stale['node_id']}  {stale['locator']}: {stale['reason']}")
    for node_id in result["fresh_again"]:
        print(f"  fresh  {node_id}  (its file is back as it was)")
    if result["not_hashed"]:
        print(f"{result['not_hashed']} cells name a file that was not found when they were stored: not checked.")
    return EXIT_OK
