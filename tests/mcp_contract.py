"""The MCP tool contract of DESIGN §7, written once for every test that checks it."""

# tool: (readOnlyHint, destructiveHint, idempotentHint); openWorldHint is false for all.
ANNOTATIONS = {
    "store": (False, False, False),
    "recall": (True, False, True),
    "query": (True, False, True),
    "start_session": (False, False, False),
    "end_session": (False, False, True),
    "place_beacon": (False, False, False),
    "list_beacons": (True, False, True),
    "inbox": (True, False, True),
    "get_scene": (True, False, True),
    "list_scenes": (True, False, True),
    "pull_inbox": (False, False, False),
}
