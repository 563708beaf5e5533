"""``/openapi.json``, derived from the REST route table so the two always agree."""

from __future__ import annotations

from typing import Any

from node.cells import LAYERS
from node.energy import CELL_TYPES
from .rest import ROUTES, Route

__all__ = ["openapi_document"]

_FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "content": {"type": "string", "minLength": 1, "description": "1 byte to 64 KiB of UTF-8"},
    "cell_type": {"type": "string", "enum": list(CELL_TYPES)},
    "salience": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
    "scene_id": {"type": "string", "format": "uuid"},
    "source_ref": {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "locator": {"type": "string"}},
        "required": ["kind", "locator"],
        "additionalProperties": False,
    },
    "metadata": {
        "type": "object",
        "description": "at most 16 KiB as JSON; `supersedes`: the ids of the cells this one replaces (at most 16)",
        "properties": {"supersedes": {"type": "array", "items": {"type": "string", "format": "uuid"}, "maxItems": 16}},
    },
    "include_superseded": {"type": "boolean", "default": False, "description": "also cells replaced by others"},
    "idempotency_key": {"type": "string", "maxLength": 200},
    "project": {"type": "string"},
    "query": {"type": "string", "minLength": 1},
    "k": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
    "layer": {"type": "string", "enum": list(LAYERS)},
    "cell_types": {"type": "array", "items": {"type": "string", "enum": list(CELL_TYPES)}},
    "threshold": {"type": "number", "minimum": 0, "maximum": 1},
    "min_salience": {"type": "number", "minimum": 0, "maximum": 1},
    "ttl_seconds": {"type": "integer", "minimum": 1},
    "title": {"type": "string"},
    "limit": {"type": "integer", "minimum": 1, "maximum": 500},
    "since": {"type": "string", "description": "milliseconds since the epoch, or an RFC 3339 time"},
    "cursor": {"type": "string"},
    "name": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"},
    "projects": {"type": "array", "items": {"type": "string"}},
    "path": {"type": "string", "description": "an absolute file path on the daemon's machine"},
    "node_ids": {"type": "array", "items": {"type": "string", "format": "uuid"}, "minItems": 1, "maxItems": 10000},
    "agent": {"type": "string", "description": "an agent's name on this node"},
}
_REQUIRED = {
    "/v1/cells": ["content", "cell_type"],
    "/v1/search": ["query"],
    "/v1/recall": ["query"],
    "/v1/beacons": ["query"],
    "/v1/sessions": ["project"],
    "/v1/admin/agents": ["name"],
    "/v1/admin/export": ["path"],
    "/v1/admin/import": ["path"],
    "/v1/admin/forget": ["node_ids"],
}
_ERROR = {
    "description": "An error with a stable reason code",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {"reason": {"type": "string"}, "message": {"type": "string"}, "field": {"type": "string"}},
                        "required": ["reason", "message"],
                    }
                },
                "required": ["error"],
            }
        }
    },
}


def _operation(route: Route) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": route.handler.__name__.lstrip("_"),
        "tags": [route.tag],
        "responses": {
            str(route.status): {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
            "400": _ERROR,
            "404": _ERROR,
        },
    }
    if route.auth == "key":
        op["security"] = [{"apiKey": []}]
        # 429: the key's rate limit (node.ratelimit), answered with Retry-After.
        op["responses"].update({"401": _ERROR, "403": _ERROR, "429": _ERROR})
    elif route.auth == "admin":
        op["security"] = [{"adminToken": []}]
        op["responses"]["401"] = _ERROR
    else:
        op["security"] = []
    if route.method in ("POST", "DELETE"):
        op["responses"]["507"] = _ERROR  # disk_full: nothing was stored, reads go on
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in route.pattern.groupindex
    ]
    params += [{"name": name, "in": "query", "required": False, "schema": _FIELD_SCHEMAS[name]} for name in route.query]
    if params:
        op["parameters"] = params
    if route.body:
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {name: _FIELD_SCHEMAS[name] for name in route.body},
            "additionalProperties": False,
        }
        if route.path in _REQUIRED:
            schema["required"] = _REQUIRED[route.path]
        op["requestBody"] = {"required": route.path in _REQUIRED, "content": {"application/json": {"schema": schema}}}
    return op


def openapi_document(version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Hyphae node API",
            "version": version,
            "description": "REST surface of a Hyphae memory node. MCP is served at POST /mcp.",
        },
        "servers": [{"url": "http://127.0.0.1:7777"}],
        "components": {
            "securitySchemes": {
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-hyphae-key"},
                "adminToken": {"type": "apiKey", "in": "header", "name": "x-hyphae-admin"},
            }
        },
        "paths": paths,
    }
