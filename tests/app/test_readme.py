"""The README's reference tables say what the code does: each MCP tool's arguments are its
``inputSchema`` (optional ones marked ``?``), and the CLI table names every command."""

from __future__ import annotations

import re
from pathlib import Path

from app.cli.parser import build_parser
from mcp_bridge.tools import TOOLS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def test_each_tools_arguments_in_the_readme_are_its_input_schema():
    rows = {}
    text = section("MCP tools")
    table = text[text.index("| tool | arguments |"):].split("\n\n")[0]  # the tools' table (prompts have one too)
    for line in table.splitlines():
        match = re.match(r"^\| `(\w+)` \| ([^|]*) \|", line)
        if match:
            rows[match.group(1)] = re.findall(r"`(\w+)(\??)`", match.group(2))
    assert set(rows) == {tool.name for tool in TOOLS}
    for tool in TOOLS:
        schema = tool.input_schema
        documented = {name: mark == "" for name, mark in rows[tool.name]}
        assert set(documented) == set(schema.get("properties", {})), tool.name
        required = {name for name, is_required in documented.items() if is_required}
        assert required == set(schema.get("required", ())), tool.name


def test_the_cli_table_names_every_command():
    table = section("CLI")
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    for name in commands.choices:
        assert f"`hyphae {name}" in table, f"`hyphae {name}` is missing from the README's CLI table"
