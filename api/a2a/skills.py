"""The four skills of the card, each a call or two of the facade, behind the SDK's RequestHandler.

A message names its skill in its metadata (``{"skill": "recall"}``) or in a data part
(``{"skill": "recall", "k": 3}``, whose other keys are the skill's arguments); a text
message may instead start with the skill's words ("remember: ...", "recall: ...",
"catch up", "what does the team know about ..."). The answer is one agent message: a
text part for people and a data part with the facade's result for programs. Nothing
here keeps state between calls, so the SDK's task methods are refused as unsupported.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
from a2a.utils.errors import (
    InternalError,
    InvalidParamsError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from node.errors import HyphaeError, Unavailable
from node.principals import Principal
from node.service import MemoryService

from .card import SKILLS

__all__ = ["PRINCIPAL_KEY", "MemorySkills"]

PRINCIPAL_KEY = "hyphae.principal"  # where the authenticated caller rides in the ASGI scope and the call context

# The arguments each skill takes from a data part (the text is the content or the query).
_ARGUMENTS = {
    "remember": {"content", "cell_type", "salience", "project", "metadata", "source_ref", "scene_id", "idempotency_key"},
    "recall": {"query", "k", "cell_types", "project", "include_superseded"},
    "catch_up": {"since", "limit", "include_superseded"},
    "team_knowledge": {"query", "k", "cell_types", "project"},
}
_PREFIXES = (
    (re.compile(r"^\s*remember\b\s*(?:that\b)?[:,]?\s*", re.IGNORECASE), "remember"),
    (re.compile(r"^\s*recall\b[:,]?\s*", re.IGNORECASE), "recall"),
    (re.compile(r"^\s*catch(?:ing)?[ -]up\b[.!:]?\s*", re.IGNORECASE), "catch_up"),
    (re.compile(r"^\s*what\s+does\s+the\s+team\s+know\s+about\b[:,]?\s*", re.IGNORECASE), "team_knowledge"),
)
_WORD = re.compile(r"[a-z0-9]{3,}")


class MemorySkills(RequestHandler):
    """``message/send`` and ``message/stream`` (``SendMessage``, ``SendStreamingMessage``) over the facade."""

    def __init__(self, service: MemoryService) -> None:
        self.service = service

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message:
        return await self._answer(params, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Message]:
        # Each skill is one facade call that answers at once: the stream carries the one message.
        yield await self._answer(params, context)

    async def _answer(self, params: SendMessageRequest, context: ServerCallContext) -> Message:
        principal = context.state.get(PRINCIPAL_KEY)
        if not isinstance(principal, Principal):  # the app authenticates before the SDK runs; never from the message
            raise InternalError("no authenticated caller for this call")
        skill, text, arguments = parse_request(params.message)
        try:
            result = await getattr(self, "_" + skill)(principal, text, arguments)
        except Unavailable as exc:
            raise InternalError(exc.message, data=_error_data(exc)) from None
        except HyphaeError as exc:  # invalid, forbidden, not found, conflict: the caller's, with the core's reason
            raise InvalidParamsError(exc.message, data=_error_data(exc)) from None
        summary, data = result
        return Message(
            message_id=str(uuid.uuid4()),
            context_id=params.message.context_id,
            task_id=params.message.task_id,
            role=Role.ROLE_AGENT,
            parts=[Part(text=summary), Part(data=ParseDict(data, Value()), media_type="application/json")],
            metadata={"skill": skill},
        )

    # -- the skills: (text for people, data for programs) ---------------------------------

    async def _remember(self, principal: Principal, text: str, arguments: dict[str, Any]):
        arguments.setdefault("content", text or None)
        arguments.setdefault("cell_type", "Fact")  # "remember: X" in plain words states a fact
        stored = await self.service.store(principal, **arguments)
        return f"Remembered as cell {stored['node_id']}.", stored

    async def _recall(self, principal: Principal, text: str, arguments: dict[str, Any]):
        arguments.setdefault("query", text or None)
        found = await self.service.search(principal, layer="L0", **arguments)
        return _cells_text(found["results"], "No cell matches."), found

    async def _catch_up(self, principal: Principal, text: str, arguments: dict[str, Any]):
        inbox = await self.service.inbox(principal, **arguments)
        lines = [f"- {d['content']} ({d['cell_type']}, by {d['source_agent']} on {d['origin_node']})" for d in inbox["diffs"]]
        return ("\n".join(lines) if lines else "Nothing new in your inbox."), inbox

    async def _team_knowledge(self, principal: Principal, text: str, arguments: dict[str, Any]):
        arguments.setdefault("query", text or None)
        found = await self.service.search(principal, layer="L0", **arguments)
        beacons = (await self.service.list_beacons(principal))["beacons"]
        words = set(_WORD.findall(str(arguments["query"]).lower()))
        watching = [b for b in beacons if words & set(_WORD.findall(str(b.get("query", "")).lower()))]
        contributors = sorted({(c["source_agent"], c["origin_node"]) for c in found["results"]})
        data = {
            "results": found["results"],
            "contributors": [{"source_agent": a, "origin_node": n} for a, n in contributors],
            "beacons": watching,
        }
        text_out = _cells_text(found["results"], "The team has shared nothing about this yet.")
        if watching:
            text_out += f"\nYour beacons watching this: {', '.join(repr(b['query']) for b in watching)}."
        return text_out, data

    # -- what a stateless agent does not do ------------------------------------------------

    async def on_get_task(self, params, context):
        raise UnsupportedOperationError("this agent answers every message at once and keeps no tasks")

    on_list_tasks = on_cancel_task = on_get_task
    on_create_task_push_notification_config = on_get_task_push_notification_config = on_get_task
    on_list_task_push_notification_configs = on_delete_task_push_notification_config = on_get_task
    on_get_extended_agent_card = on_get_task

    async def on_subscribe_to_task(self, params, context):
        raise UnsupportedOperationError("this agent answers every message at once and keeps no tasks")
        yield  # an async generator, as the SDK expects


def parse_request(message: Message) -> tuple[str, str, dict[str, Any]]:
    """(skill, text, arguments) from a message; a clear InvalidParamsError when it names no skill."""
    texts = [part.text for part in message.parts if part.HasField("text")]
    data: dict[str, Any] = {}
    for part in message.parts:
        if part.HasField("data"):
            value = MessageToDict(part.data)
            if not isinstance(value, dict):
                raise InvalidParamsError("a data part must hold a JSON object of the skill's arguments")
            data.update(value)
    text = "\n".join(texts).strip()
    skill = data.pop("skill", None) or MessageToDict(message.metadata).get("skill")
    if skill is None:
        for pattern, name in _PREFIXES:
            match = pattern.match(text)
            if match:
                skill, text = name, text[match.end():].strip()
                break
    elif isinstance(skill, str):
        for pattern, name in _PREFIXES:  # "recall: X" with the skill named too: the words are not the query
            if name == skill and (match := pattern.match(text)):
                text = text[match.end():].strip()
    if not isinstance(skill, str) or skill not in SKILLS:
        raise InvalidParamsError(
            f"name a skill: one of {', '.join(SKILLS)} (message metadata or a data part \"skill\"), "
            "or start the text with \"remember:\", \"recall:\", \"catch up\" or \"what does the team know about\"",
            data={"reason": "invalid_argument", "field": "skill"},
        )
    unknown = sorted(set(data) - _ARGUMENTS[skill])
    if unknown:
        raise InvalidParamsError(
            f"the {skill} skill takes no {', '.join(unknown)}; it takes {', '.join(sorted(_ARGUMENTS[skill]))}",
            data={"reason": "invalid_argument", "field": unknown[0]},
        )
    for key in ("k", "limit"):  # a Struct carries every number as a double; the facade wants whole numbers
        if isinstance(data.get(key), float) and data[key].is_integer():
            data[key] = int(data[key])
    return skill, text, data


def _error_data(exc: HyphaeError) -> dict[str, str]:
    """The core's error as the ErrorInfo metadata of the answer (a map of strings)."""
    return {key: str(value) for key, value in exc.to_dict().items()}


def _cells_text(cells: list[dict[str, Any]], empty: str) -> str:
    if not cells:
        return empty
    return "\n".join(
        f"- {c['content']} ({c['cell_type']}, by {c['source_agent']} on {c['origin_node']}, {c['provenance']['hops']} hops)"
        for c in cells
    )
