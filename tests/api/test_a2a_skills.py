"""Which skill a message names, and with which arguments (api.a2a.skills.parse_request)."""

from __future__ import annotations

import pytest
from a2a.types.a2a_pb2 import Message, Part, Role
from a2a.utils.errors import InvalidParamsError
from google.protobuf.struct_pb2 import Value

from api.a2a.skills import parse_request


def message(*texts: str, data: dict | None = None, metadata: dict | None = None) -> Message:
    parts = [Part(text=text) for text in texts]
    if data is not None:
        value = Value()
        value.struct_value.update(data)
        parts.append(Part(data=value))
    sent = Message(message_id="m", role=Role.ROLE_USER, parts=parts)
    if metadata is not None:
        sent.metadata.update(metadata)
    return sent


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        (message("remember: ship on Fridays"), ("remember", "ship on Fridays", {})),
        (message("Remember that we ship on Fridays"), ("remember", "we ship on Fridays", {})),
        (message("recall: release day"), ("recall", "release day", {})),
        (message("Catch up."), ("catch_up", "", {})),
        (message("What does the team know about releases?"), ("team_knowledge", "releases?", {})),
        (message("release day", metadata={"skill": "recall"}), ("recall", "release day", {})),
        (message("recall: release day", metadata={"skill": "recall"}), ("recall", "release day", {})),
        (message(data={"skill": "recall", "query": "release day", "k": 3}), ("recall", "", {"query": "release day", "k": 3})),
        (message("a note", data={"skill": "remember", "cell_type": "Decision"}), ("remember", "a note", {"cell_type": "Decision"})),
    ],
    ids=["remember-prefix", "remember-that", "recall-prefix", "catch-up", "team", "metadata", "metadata-and-prefix",
         "data-part", "text-and-data"],
)  # fmt: skip
def test_a_message_names_its_skill(sent, expected) -> None:
    skill, text, arguments = parse_request(sent)
    assert (skill, text, arguments) == expected
    assert all(type(arguments[key]) is int for key in ("k", "limit") if key in arguments)  # not a Struct's double


@pytest.mark.parametrize(
    ("sent", "complaint"),
    [
        (message("hello"), "name a skill"),
        (message("x", metadata={"skill": "forget"}), "name a skill"),
        (message("x", metadata={"skill": ["recall"]}), "name a skill"),
        (message("recall: x", data={"node_id": "n"}), "takes no node_id"),
        (message("remember: x", data={"source_agent": "someone-else"}), "takes no source_agent"),
    ],
    ids=["no-skill", "unknown-skill", "skill-not-a-string", "unknown-argument", "identity-argument"],
)
def test_a_message_without_a_usable_skill_is_refused_clearly(sent, complaint) -> None:
    with pytest.raises(InvalidParamsError, match=complaint):
        parse_request(sent)
