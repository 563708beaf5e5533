"""The node's Agent Card: who answers at this address, with which skills, behind which keys."""

from __future__ import annotations

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    APIKeySecurityScheme,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol

__all__ = ["API_KEY_SCHEME", "BEARER_SCHEME", "SKILLS", "agent_card"]

API_KEY_SCHEME = "hyphaeKey"
BEARER_SCHEME = "bearer"

# id -> (name, description, examples). The ids are what a message names (metadata "skill").
SKILLS: dict[str, tuple[str, str, list[str]]] = {
    "remember": (
        "Remember",
        ("Store a memory cell for the team: the message's text is the content; a data part may add "
         "cell_type (Fact unless given: Decision, Constraint, Context, ...), salience, project, metadata, "
         "source_ref. Answers with the new cell's node_id."),
        ["remember: the payments service retries webhooks 5 times with exponential backoff"],
    ),
    "recall": (
        "Recall",
        ("The cells nearest to the text (by meaning and words), with their content and provenance "
         "(origin node, source agent, hops). A data part may add k, cell_types, project."),
        ["recall: how are webhooks retried?"],
    ),
    "catch_up": (
        "Catch up",
        ("My inbox: the cells other agents stored that matched my beacons, oldest first; a data part "
         "may add since (ms or RFC 3339) and limit. Reading changes nothing."),
        ["catch up"],
    ),
    "team_knowledge": (
        "What does the team know about X",
        ("Recall over everything the team shared about X, who contributed it, and which of my beacons "
         "already watch X (so new knowledge about it reaches my inbox)."),
        ["what does the team know about webhook retries?"],
    ),
}


def agent_card(url: str, version: str, node_name: str) -> AgentCard:
    """The card for the JSON-RPC endpoint at ``url`` (absolute)."""
    return AgentCard(
        name=f"Hyphae memory node {node_name}",
        description="A memory layer shared by a team's AI agents: remember, recall, catch up on what "
        "teammates' agents learned, and ask what the team knows about a topic.",
        version=version,
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding=TransportProtocol.JSONRPC, protocol_version=PROTOCOL_VERSION_CURRENT)
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={
            API_KEY_SCHEME: SecurityScheme(api_key_security_scheme=APIKeySecurityScheme(
                location="header", name="x-hyphae-key", description="An agent's key from `hyphae agent add NAME`",
            )),
            BEARER_SCHEME: SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="Bearer", description="The same agent key as a Bearer token",
            )),
        },
        # Either scheme suffices: two requirements, each naming one.
        security_requirements=[
            SecurityRequirement(schemes={API_KEY_SCHEME: StringList()}),
            SecurityRequirement(schemes={BEARER_SCHEME: StringList()}),
        ],
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(id=skill_id, name=name, description=description, tags=["memory"], examples=examples)
            for skill_id, (name, description, examples) in SKILLS.items()
        ],
    )
