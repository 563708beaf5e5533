"""The 11 tool descriptors (seeds 000, 001; DESIGN §7) and the argument checker."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_bridge import schema, tools
from mcp_bridge.jsonrpc import INVALID_PARAMS, JsonRpcError
from node.energy import CELL_TYPES
from tests.mcp_contract import ANNOTATIONS  # noqa: E402

ROSTER = [
    "store", "recall", "query", "start_session", "end_session", "place_beacon",
    "list_beacons", "inbox", "get_scene", "list_scenes", "pull_inbox",
]

HINTS = ANNOTATIONS

# tool: (arguments, required)
ARGUMENTS = {
    "store": ({"content", "cell_type", "salience", "scene_id", "source_ref", "metadata", "idempotency_key"},
              {"content", "cell_type"}),
    "recall": ({"query", "k", "cell_types", "project"}, {"query"}),
    "query": ({"query", "layer", "k", "cell_types", "project"}, {"query", "layer"}),
    "start_session": ({"project", "title"}, {"project"}),
    "end_session": ({"session_id"}, {"session_id"}),
    "place_beacon": ({"query", "threshold", "cell_types", "project", "min_salience", "ttl_seconds"}, {"query"}),
    "list_beacons": (set(), set()),
    "inbox": ({"since", "limit"}, set()),
    "get_scene": ({"scene_id"}, {"scene_id"}),
    "list_scenes": ({"project", "limit", "cursor"}, set()),
    "pull_inbox": ({"limit"}, set()),
}

DESCRIPTORS = tools.tool_descriptors()
BY_NAME = {d["name"]: d for d in DESCRIPTORS}
SCENE_ID = "6f9619ff-8b86-d011-b42d-00cf4fc964ff"


# -- the roster and the descriptors ---------------------------------------------------


def test_exactly_the_eleven_tools_in_roster_order() -> None:
    assert [d["name"] for d in DESCRIPTORS] == ROSTER


def test_consolidate_scene_is_not_an_mcp_tool() -> None:
    assert "consolidate_scene" not in BY_NAME


@pytest.mark.parametrize("name", ROSTER)
def test_every_descriptor_has_name_title_description_and_both_schemas(name) -> None:
    descriptor = BY_NAME[name]
    assert set(descriptor) == {"name", "title", "description", "inputSchema", "outputSchema", "annotations"}
    assert descriptor["title"] and len(descriptor["description"]) > 60
    assert descriptor["inputSchema"]["type"] == "object" and descriptor["outputSchema"]["type"] == "object"


@pytest.mark.parametrize("name", ROSTER)
def test_every_descriptor_states_all_four_hints_explicitly(name) -> None:
    annotations = BY_NAME[name]["annotations"]
    hints = {k: v for k, v in annotations.items() if k.endswith("Hint")}
    assert set(hints) == {"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}
    assert all(type(v) is bool for v in hints.values())
    expected = HINTS[name]
    assert (hints["readOnlyHint"], hints["destructiveHint"], hints["idempotentHint"]) == expected
    assert hints["openWorldHint"] is False


@pytest.mark.parametrize("name", ROSTER)
def test_input_and_output_schemas_are_valid_json_schema(name) -> None:
    jsonschema.Draft202012Validator.check_schema(BY_NAME[name]["inputSchema"])
    jsonschema.Draft202012Validator.check_schema(BY_NAME[name]["outputSchema"])


@pytest.mark.parametrize("name", ROSTER)
def test_input_schemas_take_exactly_the_contracted_arguments(name) -> None:
    schema = BY_NAME[name]["inputSchema"]
    arguments, required = ARGUMENTS[name]
    assert set(schema["properties"]) == arguments
    assert set(schema.get("required", ())) == required
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("name", ROSTER)
def test_no_tool_accepts_an_identity_argument(name) -> None:
    assert not {"source_agent", "tenant_id"} & set(BY_NAME[name]["inputSchema"]["properties"])


def test_store_schema_follows_seed_001() -> None:
    props = BY_NAME["store"]["inputSchema"]["properties"]
    assert props["content"]["type"] == "string"
    assert props["cell_type"]["enum"] == [
        "Decision", "Constraint", "Risk", "Pattern", "Lesson", "Fact", "Preference", "Context", "Task",
    ] == list(CELL_TYPES)
    salience = props["salience"]
    assert (salience["type"], salience["minimum"], salience["maximum"], salience["default"]) == ("number", 0, 1, 0.5)
    assert props["scene_id"]["type"] == "string" and props["scene_id"]["format"] == "uuid"
    source_ref = props["source_ref"]
    assert source_ref["type"] == "object" and source_ref["additionalProperties"] is False
    assert set(source_ref["required"]) == {"kind", "locator"}
    assert {p["type"] for p in source_ref["properties"].values()} == {"string"}
    assert props["metadata"]["type"] == "object"
    assert props["idempotency_key"]["type"] == "string" and props["idempotency_key"]["maxLength"] == 200


def test_the_other_argument_ranges_follow_design_section_7() -> None:
    recall, query = BY_NAME["recall"]["inputSchema"]["properties"], BY_NAME["query"]["inputSchema"]["properties"]
    assert (recall["k"]["minimum"], recall["k"]["maximum"], recall["k"]["default"]) == (1, 100, 10)
    assert recall["cell_types"]["items"]["enum"] == list(CELL_TYPES)
    assert query["layer"]["enum"] == ["L0", "L1", "L2"]
    beacon = BY_NAME["place_beacon"]["inputSchema"]["properties"]
    assert (beacon["threshold"]["minimum"], beacon["threshold"]["maximum"]) == (0, 1)
    assert (beacon["min_salience"]["minimum"], beacon["min_salience"]["maximum"]) == (0, 1)
    assert beacon["ttl_seconds"]["type"] == "integer" and beacon["ttl_seconds"]["minimum"] == 1
    for name in ("inbox", "list_scenes", "pull_inbox"):
        limit = BY_NAME[name]["inputSchema"]["properties"]["limit"]
        assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 500)
    since = BY_NAME["inbox"]["inputSchema"]["properties"]["since"]
    assert set(since["type"]) == {"integer", "string"} and since["minimum"] == 0


def test_recall_and_query_return_ids_and_distances_only() -> None:
    for name in ("recall", "query"):
        item = BY_NAME[name]["outputSchema"]["properties"]["results"]["items"]
        assert set(item["properties"]) == {"node_id", "distance"}


def test_descriptors_are_fresh_copies() -> None:
    first = tools.tool_descriptors()
    first[0]["inputSchema"]["properties"].clear()
    assert tools.tool_descriptors()[0]["inputSchema"]["properties"]


# -- argument validation --------------------------------------------------------------


def _refusal(name: str, arguments) -> JsonRpcError:
    with pytest.raises(JsonRpcError) as caught:
        tools.validate_arguments(tools.get_tool(name), arguments)
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data["reason"] == "invalid_argument"
    return caught.value


@pytest.mark.parametrize(
    "name, arguments, message, field",
    [
        ("store", {"content": "x", "cell_type": "Fact", "salience": 1.5},
         "store: argument 'salience' must be a number between 0 and 1", "salience"),
        ("store", {"content": "x", "cell_type": "Fact", "salience": True},
         "store: argument 'salience' must be a number between 0 and 1", "salience"),
        ("store", {"content": "x", "cell_type": "Fact", "salience": "high"},
         "store: argument 'salience' must be a number between 0 and 1", "salience"),
        ("store", {"content": "x", "cell_type": "Fact", "source_agent": "mallory"},
         "store: unknown argument 'source_agent' (identity comes from your API key)", "source_agent"),
        ("store", {"content": "x", "cell_type": "Fact", "tenant_id": "other"},
         "store: unknown argument 'tenant_id' (identity comes from your API key)", "tenant_id"),
        ("store", {"content": "x", "cell_type": "Fact", "tags": []},
         "store: unknown argument 'tags'; it takes content, cell_type, salience", "tags"),
        ("store", {"cell_type": "Fact"}, "store: missing required argument 'content'", "content"),
        ("store", {"content": "x", "cell_type": "decision"},
         "store: argument 'cell_type' must be one of Decision, Constraint, Risk, Pattern, Lesson, Fact, "
         "Preference, Context, Task", "cell_type"),
        ("store", {"content": "", "cell_type": "Fact"}, "store: argument 'content' must be a non-empty string",
         "content"),
        ("store", {"content": "x", "cell_type": "Fact", "scene_id": "scene-1"},
         "store: argument 'scene_id' must be a UUID string", "scene_id"),
        ("store", {"content": "x", "cell_type": "Fact", "source_ref": {"kind": "file"}},
         "store: argument 'source_ref' is missing required field 'locator'", "source_ref.locator"),
        ("store", {"content": "x", "cell_type": "Fact", "source_ref": {"kind": "file", "locator": "a", "line": 3}},
         "store: argument 'source_ref' has unknown field 'line'", "source_ref.line"),
        ("store", {"content": "x", "cell_type": "Fact", "source_ref": {"kind": 1, "locator": "a"}},
         "store: argument 'source_ref.kind' must be a non-empty string", "source_ref.kind"),
        ("store", {"content": "x", "cell_type": "Fact", "source_ref": "file:1"},
         "store: argument 'source_ref' must be an object {kind, locator}", "source_ref"),
        ("store", {"content": "x", "cell_type": "Fact", "metadata": []},
         "store: argument 'metadata' must be an object", "metadata"),
        ("store", {"content": "x", "cell_type": "Fact", "idempotency_key": "k" * 201},
         "store: argument 'idempotency_key' must be a non-empty string of at most 200 characters", "idempotency_key"),
        ("recall", {"query": "q", "k": 0}, "recall: argument 'k' must be an integer between 1 and 100", "k"),
        ("recall", {"query": "q", "k": 101}, "recall: argument 'k' must be an integer between 1 and 100", "k"),
        ("recall", {"query": "q", "k": 2.5}, "recall: argument 'k' must be an integer between 1 and 100", "k"),
        ("recall", {"query": "q", "k": False}, "recall: argument 'k' must be an integer between 1 and 100", "k"),
        ("recall", {"query": "q", "cell_types": ["Fact", "Gossip"]},
         "recall: argument 'cell_types[1]' must be one of Decision", "cell_types[1]"),
        ("recall", {"query": "q", "cell_types": "Fact"}, "recall: argument 'cell_types' must be a non-empty array",
         "cell_types"),
        ("recall", {"query": "q", "cell_types": []}, "recall: argument 'cell_types' must be a non-empty array",
         "cell_types"),
        ("query", {"query": "q"}, "query: missing required argument 'layer'", "layer"),
        ("query", {"query": "q", "layer": "L3"}, "query: argument 'layer' must be one of L0, L1, L2", "layer"),
        ("place_beacon", {"query": "q", "threshold": -0.1},
         "place_beacon: argument 'threshold' must be a number between 0 and 1", "threshold"),
        ("place_beacon", {"query": "q", "ttl_seconds": 0},
         "place_beacon: argument 'ttl_seconds' must be an integer of at least 1", "ttl_seconds"),
        ("inbox", {"since": -1}, "inbox: argument 'since' must be an integer of at least 0 or an RFC 3339", "since"),
        ("inbox", {"since": "yesterday"}, "inbox: argument 'since' must be an integer of at least 0 or an RFC 3339",
         "since"),
        ("inbox", {"since": "2025-13-01T00:00:00Z"}, "inbox: argument 'since'", "since"),
        ("inbox", {"limit": 501}, "inbox: argument 'limit' must be an integer between 1 and 500", "limit"),
        ("list_beacons", {"project": "x"}, "list_beacons: unknown argument 'project'; it takes no arguments",
         "project"),
        ("get_scene", {}, "get_scene: missing required argument 'scene_id'", "scene_id"),
        ("end_session", {"session_id": None}, "end_session: argument 'session_id' must be a non-empty string",
         "session_id"),
    ],
)
def test_invalid_arguments_are_refused_naming_the_argument_and_why(name, arguments, message, field) -> None:
    error = _refusal(name, arguments)
    assert error.message.startswith(message)
    assert error.data["field"] == field


def test_arguments_must_be_an_object() -> None:
    assert "'arguments' must be an object" in _refusal("recall", ["q"]).message


def test_unknown_tool_is_refused_with_the_roster() -> None:
    with pytest.raises(JsonRpcError) as caught:
        tools.get_tool("consolidate_scene")
    assert caught.value.code == INVALID_PARAMS
    assert "unknown tool 'consolidate_scene'" in caught.value.message and "pull_inbox" in caught.value.message
    assert caught.value.data["field"] == "name"


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("store", {"content": "x", "cell_type": "Task", "salience": 0, "scene_id": SCENE_ID,
                   "source_ref": {"kind": "file", "locator": "a.py:3"}, "metadata": {"a": [1, {"b": None}]},
                   "idempotency_key": "k" * 200}),
        ("store", {"content": "x", "cell_type": "Task", "salience": 1}),
        ("recall", {"query": "q", "k": 100, "cell_types": ["Risk", "Fact"], "project": "p"}),
        ("query", {"query": "q", "layer": "L2", "k": 1}),
        ("list_beacons", {}),
        ("inbox", {"since": 0}),
        ("inbox", {"since": "2025-01-31T09:30:00Z", "limit": 500}),
        ("inbox", {"since": "2025-01-31t09:30:00.123+02:00"}),
        ("list_scenes", {"project": "p", "limit": 1, "cursor": ""}),
    ],
)
def test_valid_arguments_pass_unchanged(name, arguments) -> None:
    assert tools.validate_arguments(tools.get_tool(name), arguments) == arguments


def test_absent_arguments_mean_none() -> None:
    assert tools.validate_arguments(tools.get_tool("list_beacons"), None) == {}


def test_an_integral_float_is_an_integer_and_is_passed_on_as_int() -> None:
    checked = tools.validate_arguments(tools.get_tool("recall"), {"query": "q", "k": 5.0})
    assert checked["k"] == 5 and type(checked["k"]) is int


def test_nan_and_infinity_are_not_numbers() -> None:
    for value in (math.nan, math.inf):
        _refusal("store", {"content": "x", "cell_type": "Fact", "salience": value})


def test_validation_does_not_mutate_the_callers_arguments() -> None:
    arguments = {"query": "q", "k": 5.0}
    tools.validate_arguments(tools.get_tool("recall"), arguments)
    assert type(arguments["k"]) is float


# -- the checker agrees with jsonschema -------------------------------------------------

_checker = jsonschema.FormatChecker(formats=())
_checker.checks("uuid")(lambda s: not isinstance(s, str) or bool(schema._UUID.match(s)))
_checker.checks("date-time")(lambda s: not isinstance(s, str) or schema._is_rfc3339(s))

scalars = (
    st.none() | st.booleans() | st.integers(-5, 600) | st.floats(-2, 2, allow_nan=False)
    | st.sampled_from(["", "x", "L1", "Fact", "Decision", SCENE_ID, "2025-01-31T09:30:00Z", "k" * 201])
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["kind", "locator", "x"]), inner, max_size=3),
    max_leaves=4,
)


_VALIDATORS = {
    name: jsonschema.Draft202012Validator(d["inputSchema"], format_checker=_checker) for name, d in BY_NAME.items()
}


def _calls(name: str):
    keys = st.sampled_from([*BY_NAME[name]["inputSchema"]["properties"], "source_agent"])
    return st.tuples(st.just(name), st.dictionaries(keys, values, max_size=4))


@settings(max_examples=80, deadline=None)
@given(st.one_of([_calls(name) for name in ROSTER]))
def test_the_checker_accepts_exactly_what_jsonschema_accepts(call) -> None:
    name, arguments = call
    expected = _VALIDATORS[name].is_valid(arguments)
    try:
        tools.validate_arguments(tools.get_tool(name), arguments)
        accepted = True
    except JsonRpcError:
        accepted = False
    assert accepted == expected, json.dumps(arguments)


def test_store_declares_metadata_supersedes_and_keeps_metadata_open() -> None:
    store = tools.get_tool("store")
    metadata = store.input_schema["properties"]["metadata"]
    assert "additionalProperties" not in metadata  # any other metadata field is welcome
    supersedes = metadata["properties"]["supersedes"]
    assert supersedes == {**supersedes, "type": "array", "maxItems": 16,
                          "items": {"type": "string", "format": "uuid"}}
    assert "they stay as history, marked superseded" in supersedes["description"]
    assert "metadata.supersedes" in store.description and "marked superseded" in store.description
    ids = [f"6f9619ff-8b86-d011-b42d-00cf4fc964{i:02d}" for i in range(17)]
    ok = tools.validate_arguments(store, {"content": "c", "cell_type": "Decision",
                                          "metadata": {"supersedes": ids[:16], "ticket": "PAY-1"}})
    assert ok["metadata"]["ticket"] == "PAY-1"
    with pytest.raises(JsonRpcError) as raised:
        tools.validate_arguments(store, {"content": "c", "cell_type": "Decision", "metadata": {"supersedes": ids}})
    assert "argument 'metadata.supersedes' must be an array of at most 16 items" in raised.value.message
