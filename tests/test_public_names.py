"""Each package's public names are chosen, not accumulated: ``__all__`` is exactly this list,
and every name in it resolves. A change here is a change of a package's surface, made on
purpose (and said in the commit), never as a side effect of moving code around."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "web": {
        "HttpLimits", "serve_asgi", "serve_http", "server_choice",
        "WebError", "BodyTooLarge", "ClientGone", "is_loopback_origin", "is_loopback_host",
    },
    "node": {
        "HyphaeError", "InvalidArgument", "TooLarge", "Unauthenticated", "Forbidden", "NotFound", "Conflict",
        "Unavailable", "ConfigError", "Principal",
    },
    "mesh.runtime": {
        "MeshRuntime", "EffectSink", "wall_clock_ms", "Transport", "HttpTransport", "MemoryTransport", "MemoryHub",
        "SendError", "MeshApp", "make_mesh_app", "bind_mesh_socket", "serve_mesh", "PROTOCOL_VERSION",
        "FRAMES_PATH", "HELLO_PATH", "pack_frames", "unpack_frames", "REPLY_WITHIN", "Discovery", "SERVICE_TYPE",
        "FaultPlan", "Verdict", "watch_fault_file",
    },
    "mcp_bridge": {
        "Dispatcher", "MemoryService", "SUPPORTED_PROTOCOL_VERSIONS", "LATEST_PROTOCOL_VERSION", "INSTRUCTIONS",
        "negotiate_protocol_version", "REASON_CODES", "JsonRpcError", "TOOLS", "Tool", "tool_descriptors",
        "make_mcp_app", "MAX_BODY_BYTES", "serve_stdio", "MAX_LINE_BYTES", "HttpRelay",
    },
    "api.rest": {"make_api_app", "RestApi", "ROUTES", "openapi_document", "HttpError"},
    "app.cli": {"build_parser", "main"},
}  # fmt: skip


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_a_packages_public_names_are_exactly_its_chosen_ones(package):
    module = importlib.import_module(package)
    assert set(module.__all__) == PUBLIC[package]
    assert len(module.__all__) == len(set(module.__all__)), "a name listed twice"
    for name in module.__all__:
        assert getattr(module, name, None) is not None, f"{package}.{name} is listed but missing"
