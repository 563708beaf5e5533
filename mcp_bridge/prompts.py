"""MCP prompts: the ways a team uses its shared memory, as ready-made instructions.

A prompt only assembles messages that tell the model which tools to call and with
what; it reads and stores nothing (``prompts/get`` never reaches the facade). Prompt
arguments are strings (MCP), so lists are comma-separated and a source reference is
written ``kind:locator`` (``file:specs/storage.md:42``, ``url:https://...``).

    prompt               arguments                                 tells the model to
    catch_up             project?                                  pull_inbox until remaining is 0, read what
                                                                   matters, report grouped by project and type
    check_team_history   topic, project?                           query L1 and recall the topic, read the
                                                                   hits, say what was decided or ruled out
    record_decision      decision, rationale, source_ref?,         store one Decision with that rationale,
                         supersedes?, project?                     source_ref and metadata.supersedes

A missing required argument, an unknown one or a malformed value is -32602 with
``data.field`` naming it, as for tools.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import reason_error
from .schema import UUID_PATTERN
from .tools import MAX_SUPERSEDES

__all__ = ["PROMPTS", "get_prompt", "prompt_descriptors"]

PROMPTS: dict[str, dict[str, Any]] = {
    "catch_up": {
        "name": "catch_up",
        "title": "Catch up on what the team learned",
        "description": "What arrived in my inbox since my last session, grouped by project and cell type.",
        "arguments": [
            {"name": "project", "description": "Only report this project (default: every project).", "required": False},
        ],
    },
    "check_team_history": {
        "name": "check_team_history",
        "title": "Check the team's history before deciding",
        "description": "Before deciding something: what has the team already decided, ruled out or learned about it?",
        "arguments": [
            {"name": "topic", "description": "What you are about to decide, in a sentence.", "required": True},
            {"name": "project", "description": "Only this project's memory.", "required": False},
        ],
    },
    "record_decision": {
        "name": "record_decision",
        "title": "Record a decision",
        "description": "Store a Decision with its rationale, where it comes from, and the decisions it replaces.",
        "arguments": [
            {"name": "decision", "description": "The decision, as one self-contained sentence.", "required": True},
            {"name": "rationale", "description": "Why: the reasons and the alternatives ruled out.", "required": True},
            {
                "name": "source_ref",
                "description": "Where it was made or is written down, as kind:locator "
                "(file:docs/adr/7.md, url:https://..., issue:42).",
                "required": False,
            },
            {
                "name": "supersedes",
                "description": f"Comma-separated node_ids of the earlier decisions this one replaces (at most "
                f"{MAX_SUPERSEDES}).",
                "required": False,
            },
            {"name": "project", "description": "The project the decision belongs to.", "required": False},
        ],
    },
}


def prompt_descriptors() -> list[dict[str, Any]]:
    """The ``prompts`` array of a ``prompts/list`` result (fresh copies)."""
    return [json.loads(json.dumps(prompt)) for prompt in PROMPTS.values()]


def _arguments(name: str, given: Any) -> dict[str, str]:
    prompt = PROMPTS[name]
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise reason_error("invalid_argument", f"{name}: 'arguments' must be an object", field="arguments")
    known = {argument["name"]: argument for argument in prompt["arguments"]}
    for key, value in given.items():
        if key not in known:
            raise reason_error(
                "invalid_argument", f"{name}: unknown argument '{key}'; it takes {', '.join(known)}", field=key
            )
        if not isinstance(value, str):
            raise reason_error("invalid_argument", f"{name}: argument '{key}' must be a string", field=key)
    cleaned = {key: value.strip() for key, value in given.items() if value.strip()}
    for key, argument in known.items():
        if argument["required"] and key not in cleaned:
            raise reason_error("invalid_argument", f"{name}: missing required argument '{key}'", field=key)
    return cleaned


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": {"type": "text", "text": text}}


def _catch_up(args: dict[str, str]) -> tuple[str, str]:
    scope = f" in project {args['project']}" if "project" in args else ""
    return (
        f"Catch up on what the team learned{scope} since my last session.",
        "Catch me up on what other agents on my team stored since my last session"
        f"{scope}.\n\n"
        "1. Call the pull_inbox tool with {\"limit\": 100}, and call it again while its result's remaining is "
        "above 0. Each diff carries the cell's content, cell_type, project, salience, source_agent and why it "
        "reached me. (pull_inbox advances my inbox cursor; to look without advancing it, call inbox instead.)\n"
        + (f"2. Keep only the diffs whose project is {args['project']!r}.\n" if scope else "2. Keep every diff.\n")
        + "3. When a diff's content is not enough, read the whole cell: resources/read on "
        "hyphae://cells/{node_id}.\n"
        "4. Report grouped by project, then by cell type (Decision, Constraint, Risk, Lesson, Pattern, Fact, "
        "...): one line per cell with who stored it, Decisions and Constraints first. End with what I should "
        "act on now. If nothing arrived, say so in one line.",
    )


def _check_team_history(args: dict[str, str]) -> tuple[str, str]:
    topic = args["topic"]
    project = {"project": args["project"]} if "project" in args else {}
    kinds = ["Decision", "Constraint", "Risk", "Lesson"]
    layer_query = json.dumps({"query": topic, "layer": "L1", "k": 10, **project})
    recall = json.dumps({"query": topic, "k": 10, "cell_types": kinds, **project})
    return (
        f"What has the team already decided or ruled out about: {topic}",
        f"Before deciding anything about \"{topic}\", find out what my team already decided, ruled out or "  # noqa: ISC004
        "learned about it.\n\n"
        f"1. Call the query tool with {layer_query} (the settled knowledge) and the recall tool with {recall}.\n"
        "2. Read each hit through its resource_link, or resources/read on hyphae://cells/{node_id}; skip hits "
        "that turn out to be about something else.\n"
        "3. Answer in three short lists: decided (with who and when), ruled out (and why), open risks or "
        "constraints. Note any cell marked superseded and what replaced it. If there is nothing relevant, say "
        "so plainly; do not invent history.\n"
        "4. Only then propose what to do, and say whether it agrees with or departs from what was decided.",
    )


def _source_ref(value: str) -> dict[str, str]:
    kind, _, locator = value.partition(":")
    if not kind.strip() or not locator.strip() or " " in kind.strip():
        raise reason_error(
            "invalid_argument",
            f"record_decision: argument 'source_ref' must be kind:locator (e.g. file:docs/adr/7.md); got {value!r}",
            field="source_ref",
        )
    return {"kind": kind.strip(), "locator": locator.strip()}


def _supersedes(value: str) -> list[str]:
    ids = [part.strip() for part in value.split(",") if part.strip()]
    bad = [node_id for node_id in ids if not UUID_PATTERN.match(node_id)]
    if bad:
        raise reason_error(
            "invalid_argument",
            f"record_decision: argument 'supersedes' must be comma-separated node_ids (UUIDs); {bad[0]!r} is not one",
            field="supersedes",
        )
    if len(ids) > MAX_SUPERSEDES:
        raise reason_error(
            "invalid_argument",
            f"record_decision: argument 'supersedes' lists {len(ids)} cells; at most {MAX_SUPERSEDES}",
            field="supersedes",
        )
    return list(dict.fromkeys(ids))


def _record_decision(args: dict[str, str]) -> tuple[str, str]:
    store: dict[str, Any] = {
        "content": f"{args['decision']}\nRationale: {args['rationale']}",
        "cell_type": "Decision",
        "salience": 0.8,
    }
    if "source_ref" in args:
        store["source_ref"] = _source_ref(args["source_ref"])
    supersedes = _supersedes(args["supersedes"]) if "supersedes" in args else []
    if supersedes:
        store["metadata"] = {"supersedes": supersedes}
    steps = []
    if "project" in args:
        steps.append(
            f"If no session is open in project {args['project']!r}, call start_session with "
            f"{json.dumps({'project': args['project']})} first, so the decision is filed under that project."
        )
    if supersedes:
        steps.append(
            "Read each superseded cell (resources/read on hyphae://cells/{node_id}) and check that the new "
            "decision really replaces it; drop any id that it does not replace from metadata.supersedes."
        )
    steps.append(f"Call the store tool once with exactly these arguments:\n{json.dumps(store, indent=2)}")
    steps.append("Reply with the node_id it returns, in one line.")
    numbered = "\n".join(f"{i}. {step}" for i, step in enumerate(steps, 1))
    return (
        f"Record the decision: {args['decision']}",
        "Record this decision in the team's shared memory, so every agent that works on it knows.\n\n" + numbered,
    )


_BUILDERS = {"catch_up": _catch_up, "check_team_history": _check_team_history, "record_decision": _record_decision}


def get_prompt(params: dict[str, Any]) -> dict[str, Any]:
    """The ``prompts/get`` result: a description and the messages; nothing is read or stored."""
    name = params.get("name")
    if not isinstance(name, str) or name not in PROMPTS:
        shown = name if isinstance(name, str) else type(name).__name__
        raise reason_error(
            "invalid_argument", f"unknown prompt '{shown}'; the prompts are {', '.join(PROMPTS)}", field="name"
        )
    description, text = _BUILDERS[name](_arguments(name, params.get("arguments")))
    return {"description": description, "messages": [_user(text)]}
