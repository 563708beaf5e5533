"""The house keeps its floors: every import points down, never up or sideways.

The floors are written once, as an import-linter contract in ``pyproject.toml``:
``app`` (the composition root) > the surfaces and the simulator side by side
(``api``, ``mcp_bridge``, ``simulations``) > ``node`` (the application core) > ``mesh``
(the protocol) > ``web`` (HTTP). The first test checks the real tree against it; the
others plant one back-running import in a tree of stand-in packages and check that the
same contract refuses it, so the contract cannot quietly stop meaning anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "api", "mcp_bridge", "simulations", "node", "mesh", "web")


def _lint(config: Path, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath else dict(os.environ)
    command = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
               "sys.exit(lint_imports_command())", "--config", str(config), "--no-cache"]  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_floors_are_kept():
    result = _lint(ROOT / "pyproject.toml", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and "0 broken" in result.stdout


def _stand_in_tree(tmp_path: Path, importer: str, imported: str) -> Path:
    """Packages named like ours (prefixed, so the real ones cannot be picked up), each
    empty but for ``importer`` importing ``imported``; and the contract renamed to match."""
    prefix = "standin_"
    for name in (*PACKAGES, "api.rest", "api.grpc"):
        package = tmp_path.joinpath(*(prefix + name).split(".")) if "." not in name else (
            tmp_path / (prefix + name.split(".")[0]) / name.split(".")[1]
        )
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
    source = tmp_path.joinpath(prefix + importer.split(".")[0], *importer.split(".")[1:]) / "culprit.py"
    source.write_text(f"import {prefix}{imported}\n")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    lines = ["[tool.importlinter]", "root_packages = [" + ", ".join(f'"{prefix}{p}"' for p in PACKAGES) + "]"]
    for contract in config["contracts"]:
        assert contract["type"] == "layers", "this test knows only layers contracts"
        layers = [" | ".join(prefix + part.strip() for part in layer.split("|")) for layer in contract["layers"]]
        lines += ["[[tool.importlinter.contracts]]", f'id = "{contract["id"]}"', f'name = "{contract["name"]}"',
                  'type = "layers"', "layers = [" + ", ".join(f'"{layer}"' for layer in layers) + "]"]  # fmt: skip
    (tmp_path / "lint.toml").write_text("\n".join(lines) + "\n")
    return tmp_path / "lint.toml"


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("node", "app"),  # the core reaching for the composition root
        ("node", "api"),  # the core reaching for a surface
        ("node", "mcp_bridge"),
        ("mesh", "node"),  # the protocol reaching for the core
        ("web", "mesh"),  # HTTP reaching for the protocol
        ("api.rest", "mcp_bridge"),  # one surface reaching for another
        ("mcp_bridge", "api"),
        ("api.grpc", "app"),  # a surface reaching for the root
        ("simulations", "app"),
        ("simulations", "mcp_bridge"),
    ],
)
def test_a_back_running_import_breaks_the_floors(tmp_path, importer, imported):
    config = _stand_in_tree(tmp_path, importer, imported)
    result = _lint(config, tmp_path, pythonpath=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout, result.stdout


def test_the_stand_in_tree_is_kept_without_a_culprit(tmp_path):
    """The planted trees differ from a kept one only by their culprit (a downward import)."""
    config = _stand_in_tree(tmp_path, "app", "node")
    result = _lint(config, tmp_path, pythonpath=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
