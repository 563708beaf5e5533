"""One owner for the SQL: no module outside ``node/store/`` opens the database or runs a statement.

A module that needs something of the database asks the store for a method that takes and
returns domain objects; the statements, the connections and the schema stay in one
package, where a change to a table is made once. This test reads the source of the
node, the mesh and every surface package (as an AST, so strings and comments do not
count) and names each call that breaks the rule. Tests are exempt: they may look at the
database directly to check what was written.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("node", "mesh", "mcp_bridge", "app", "api", "web")  # the last three once they exist
STORE = ROOT / "node" / "store"
STATEMENT_RUNNERS = frozenset({"execute", "executemany", "executescript"})


def sql_calls(source: str, filename: str = "<source>") -> list[str]:
    """``line: call`` for each statement run (``.execute(`` and its kin) and each
    ``sqlite3.connect`` (however sqlite3 or connect was imported) in ``source``."""
    tree = ast.parse(source, filename=filename)
    modules, connects = {"sqlite3"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.asname or alias.name for alias in node.names if alias.name == "sqlite3")
        elif isinstance(node, ast.ImportFrom) and node.module == "sqlite3":
            connects.update(alias.asname or alias.name for alias in node.names if alias.name == "connect")
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in STATEMENT_RUNNERS:
            found.append(f"{node.lineno}: .{func.attr}(")
        elif (
            isinstance(func, ast.Attribute) and func.attr == "connect"
            and isinstance(func.value, ast.Name) and func.value.id in modules
        ):  # fmt: skip
            found.append(f"{node.lineno}: {func.value.id}.connect(")
        elif isinstance(func, ast.Name) and func.id in connects:
            found.append(f"{node.lineno}: {func.id}(  (sqlite3.connect)")
    return sorted(found, key=lambda entry: int(entry.split(":")[0]))


def sources_outside_the_store() -> list[Path]:
    paths = []
    for package in PACKAGES:
        base = ROOT / package
        if base.is_dir():
            paths.extend(p for p in sorted(base.rglob("*.py")) if STORE not in p.parents)
    return paths


def test_no_module_outside_the_store_runs_sql_or_opens_the_database():
    offences = []
    for path in sources_outside_the_store():
        for call in sql_calls(path.read_text(encoding="utf-8"), str(path)):
            offences.append(f"{path.relative_to(ROOT)}:{call}")
    assert not offences, "SQL outside node/store/ (give the store a method instead):\n" + "\n".join(offences)


def test_the_packages_are_there_to_be_read():
    """The rule must not pass by reading nothing: the node's core is among the files read."""
    read = {p.relative_to(ROOT).as_posix() for p in sources_outside_the_store()}
    assert {"node/service.py", "node/layers.py"} <= read
    assert any(p.startswith("mesh/") for p in read) and any(p.startswith("mcp_bridge/") for p in read)
    assert not any(p.startswith("node/store/") for p in read)


def test_the_store_is_where_the_statements_are():
    assert sql_calls((STORE / "cells.py").read_text(encoding="utf-8"))
    assert sql_calls((STORE / "database.py").read_text(encoding="utf-8"))


def test_the_check_sees_every_way_of_running_sql():
    source = (
        "import sqlite3\n"
        "import sqlite3 as lite\n"
        "from sqlite3 import connect as opener\n"
        "conn = sqlite3.connect('x.db')\n"
        "other = lite.connect('y.db')\n"
        "third = opener('z.db')\n"
        "conn.execute('SELECT 1')\n"
        "tx.executemany('INSERT INTO t VALUES (?)', rows)\n"
        "conn.executescript('CREATE TABLE t (x)')\n"
        "note = 'SELECT * FROM cells'  # a string alone runs nothing\n"
        "service.connect_peer(address)\n"
    )
    assert sql_calls(source) == [
        "4: sqlite3.connect(",
        "5: lite.connect(",
        "6: opener(  (sqlite3.connect)",
        "7: .execute(",
        "8: .executemany(",
        "9: .executescript(",
    ]
