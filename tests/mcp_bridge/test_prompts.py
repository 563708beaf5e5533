"""MCP prompts: each lists its arguments, assembles messages naming the tools to call, stores nothing."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import trio

from mcp_bridge import Dispatcher
from mcp_bridge.tools import get_tool, validate_arguments
from tests.mcp_bridge.fakes import ALICE, FakeService


async def call(method: str, params: dict[str, Any] | None = None) -> tuple[dict[str, Any], FakeService]:
    service = FakeService()
    dispatcher = Dispatcher(service, server_version="test")
    with trio.fail_after(10):
        response = await dispatcher.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}, ALICE)
    assert service.calls == []  # a prompt reads and stores nothing
    return json.loads(json.dumps(response)), service


async def get(name: str, **arguments: str) -> str:
    response, _ = await call("prompts/get", {"name": name, "arguments": arguments})
    result = response["result"]
    assert result["description"]
    [message] = result["messages"]
    assert message["role"] == "user" and message["content"]["type"] == "text"
    return message["content"]["text"]


async def refused(name: str, field: str, **arguments: Any) -> str:
    response, _ = await call("prompts/get", {"name": name, "arguments": arguments})
    error = response["error"]
    assert error["code"] == -32602 and error["data"]["field"] == field, error
    return error["message"]


async def test_prompts_list_names_three_prompts_with_their_arguments():
    response, _ = await call("prompts/list")
    prompts = {p["name"]: p for p in response["result"]["prompts"]}
    assert list(prompts) == ["catch_up", "check_team_history", "record_decision"]
    required = {name: [a["name"] for a in p["arguments"] if a["required"]] for name, p in prompts.items()}
    assert required == {"catch_up": [], "check_team_history": ["topic"], "record_decision": ["decision", "rationale"]}
    assert all(p["title"] and p["description"] and all(a["description"] for a in p["arguments"])
               for p in prompts.values())


async def test_catch_up_drains_the_inbox_and_groups_by_project_and_type():
    text = await get("catch_up")
    assert "pull_inbox" in text and "remaining" in text and "grouped by project, then by cell type" in text
    scoped = await get("catch_up", project="billing")
    assert "'billing'" in scoped and "in project billing" in scoped


async def test_check_team_history_queries_settled_knowledge_and_recalls_decisions():
    text = await get("check_team_history", topic="switch the queue to Kafka", project="ingest")
    query = json.loads(re.search(r"query tool with (\{.*?\})", text).group(1))
    recall = json.loads(re.search(r"recall tool with (\{.*?\})", text).group(1))
    assert query == {"query": "switch the queue to Kafka", "layer": "L1", "k": 10, "project": "ingest"}
    assert recall["cell_types"] == ["Decision", "Constraint", "Risk", "Lesson"] and recall["project"] == "ingest"
    validate_arguments(get_tool("query"), query)  # the calls it asks for are valid calls
    validate_arguments(get_tool("recall"), recall)
    assert "ruled out" in text and "resources/read" in text
    assert "missing required argument 'topic'" in await refused("check_team_history", "topic")
    await refused("check_team_history", "topic", topic="   ")


async def test_record_decision_spells_out_one_valid_store_call():
    old = [str(uuid.uuid4()), str(uuid.uuid4())]
    text = await get(
        "record_decision", decision="Use Postgres for the ledger.", rationale="SQLite locks under concurrent writers.",
        source_ref="file:docs/adr/7.md:12", supersedes=f"{old[0]}, {old[1]},{old[0]}", project="ledger",
    )
    arguments = json.loads(text[text.index("{", text.index("store tool")): text.rindex("}") + 1])
    assert arguments == {
        "content": "Use Postgres for the ledger.\nRationale: SQLite locks under concurrent writers.",
        "cell_type": "Decision",
        "salience": 0.8,
        "source_ref": {"kind": "file", "locator": "docs/adr/7.md:12"},
        "metadata": {"supersedes": old},
    }
    validate_arguments(get_tool("store"), arguments)
    assert "start_session" in text and "'ledger'" in text

    plain = await get("record_decision", decision="Ship on Thursdays.", rationale="QA is in on Wednesdays.")
    assert "metadata" not in plain and "source_ref" not in plain and "start_session" not in plain


async def test_record_decision_refuses_what_store_would_refuse():
    base = {"decision": "d", "rationale": "r"}
    assert "'nope' is not one" in await refused("record_decision", "supersedes", **base, supersedes="nope")
    too_many = ",".join(str(uuid.uuid4()) for _ in range(17))
    assert "at most 16" in await refused("record_decision", "supersedes", **base, supersedes=too_many)
    assert "kind:locator" in await refused("record_decision", "source_ref", **base, source_ref="no-colon")
    await refused("record_decision", "rationale", decision="d")
    await refused("record_decision", "salience", **base, salience="0.9")
    await refused("record_decision", "decision", decision=7, rationale="r")


async def test_an_unknown_prompt_is_invalid_params():
    for params in ({"name": "summarise"}, {}, {"name": 3}):
        response, _ = await call("prompts/get", params)
        assert response["error"]["code"] == -32602 and response["error"]["data"]["field"] == "name"
    assert "catch_up, check_team_history, record_decision" in response["error"]["message"]
