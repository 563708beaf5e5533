"""A stdio MCP server that does no work: the floor any server reaches through the benchmark's client.

It speaks just enough MCP for the harness (initialize, tools/list, tools/call of ``remember`` and
``recall``), appends each memory to a JSON-lines file and answers ``recall`` with the newest keys,
unranked. What the harness measures against it is the cost of the official SDK client, the pipes
and the JSON framing: no memory server, however fast, can go faster through the same client.
Standard library only, so its start-up is Python's.
"""

from __future__ import annotations

import json
import os
import sys

TOOLS = [
    {"name": "remember", "description": "Keep a text.", "inputSchema": {
        "type": "object", "properties": {"text": {"type": "string"}, "key": {"type": "string"}},
        "required": ["text", "key"]}},
    {"name": "recall", "description": "The newest keys.", "inputSchema": {
        "type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
        "required": ["query"]}},
]  # fmt: skip


def main() -> None:
    path = os.environ["NULL_MEMORY_FILE"]
    keys: list[str] = []
    out = sys.stdout
    with open(path, "a", encoding="utf-8") as memory_file:
        for line in sys.stdin:
            message = json.loads(line)
            if "id" not in message:
                continue  # a notification
            method, params = message.get("method"), message.get("params") or {}
            if method == "initialize":
                result = {"protocolVersion": params.get("protocolVersion", "2025-06-18"), "capabilities": {"tools": {}},
                          "serverInfo": {"name": "null-memory", "version": "0"}}  # fmt: skip
            elif method == "tools/list":
                result = {"tools": TOOLS}
            elif method == "tools/call" and params.get("name") == "remember":
                arguments = params["arguments"]
                memory_file.write(json.dumps({"key": arguments["key"], "text": arguments["text"]}) + "\n")
                memory_file.flush()
                keys.append(arguments["key"])
                result = _content({"key": arguments["key"]})
            elif method == "tools/call" and params.get("name") == "recall":
                result = _content({"keys": keys[-int(params["arguments"].get("k", 10)):]})
            elif method == "ping":
                result = {}
            else:
                out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"],
                                      "error": {"code": -32601, "message": f"no method {method}"}}) + "\n")  # fmt: skip
                out.flush()
                continue
            out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
            out.flush()


def _content(data: dict) -> dict:
    return {"content": [{"type": "text", "text": json.dumps(data)}], "structuredContent": data, "isError": False}


if __name__ == "__main__":
    main()
