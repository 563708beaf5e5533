"""The README's quick starts, command by command, as a new user runs them: "A team in five
minutes" (two machines) and "An agent's memory in one minute" (one machine, connecting Claude
Code).

The commands are read out of README.md (the ``<!-- walkthrough: NAME -->`` blocks of that
section), so the docs and this test cannot drift apart. They run through the installed
``hyphae`` console script of this virtualenv (CI builds a fresh one for every run), in two
data dirs, one per "machine". What this test adds to the README, and why:

- ``hyphae up`` gets ``--api 127.0.0.1:0 --mesh 127.0.0.1:0``: two nodes on one machine need
  their own ports, and a loopback mesh makes zeroconf advertise and browse on 127.0.0.1, so
  the nodes find each other by zeroconf alone, as on a LAN (no ``--peer``);
- it runs in the background, and the test waits for it to serve (``/healthz``);
- between steps a person would wait a second: the test waits, with deadlines, for the two
  nodes to be connected and for Bob's beacon to reach Alice's node before she stores.

The one-minute section runs each line in ``bash`` (it uses ``$(...)`` and ``${VAR:-default}``),
with a data dir that is not the default one, and a stand-in ``claude`` on ``PATH`` that records
its arguments; the test then starts the MCP server exactly as Claude Code would from them (the
command and ``--env`` pairs alone, another working directory, a ``PATH`` without this
virtualenv) and talks MCP to it. After ``hyphae init`` the API port is set to 127.0.0.1:0, so
the daemon ``hyphae mcp`` starts never meets another test's port; ``hyphae stop`` ends it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import string
import subprocess
import sys
from pathlib import Path

import httpx

from tests.e2e.conftest import read_daemon_json, stop_pid
from tests.e2e_mesh.cluster import stop_processes, wait_until

README = Path(__file__).resolve().parents[2] / "README.md"
HYPHAE = Path(sys.executable).with_name("hyphae")  # the console script pip installed
SECTION = "## A team in five minutes"
SOLO_SECTION = "## An agent's memory in one minute"
TOKEN_PLACEHOLDER = "hyphae1.…"
DECISION = "Use pgvector for the V1 storage backend."
DEADLINE = 60.0  # seconds: a daemon loads the built-in model; CI machines are small
FIND_DEADLINE = 30.0  # zeroconf probing and resolving on loopback
COMMAND_TIMEOUT = 120.0

_BLOCK = re.compile(r"<!-- walkthrough: (\w+) -->\s*```sh\n(.*?)```", re.S)
_EXPORT = re.compile(r"^export (\w+)=\$\((.+) \| tail -1\)$")


def walkthrough_steps(section: str = SECTION) -> list[tuple[str, str]]:
    """(machine, command) in README order, comments stripped."""
    text = README.read_text(encoding="utf-8")
    start = text.index(section)
    end = text.find("\n#", start + len(section))
    steps = []
    for machine, body in _BLOCK.findall(text[start : end if end > 0 else len(text)]):
        for line in body.splitlines():
            command = re.split(r"\s{2,}#", line)[0].strip()
            if command:
                steps.append((machine, command))
    return steps


class Machine:
    """One developer's data dir, shell variables and (once started) daemon."""

    def __init__(self, name: str, home: Path) -> None:
        self.name = name
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HYPHAE_")}
        self.env.update(HYPHAE_HOME=str(home), PYTHONUNBUFFERED="1", NO_COLOR="1")
        self.daemon: subprocess.Popen | None = None
        self.log = home.parent / f"{name}-daemon.log"
        self.outputs: list[str] = []

    def argv(self, command: str) -> list[str]:
        words = [string.Template(word).safe_substitute(self.env) for word in shlex.split(command)]
        assert words[0] == "hyphae", f"the quick start should only run hyphae, not {command!r}"
        return [str(HYPHAE), *words[1:]]

    def run(self, command: str) -> str:
        argv = self.argv(command)
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        assert result.returncode == 0, f"{self.name}$ {command}\nexit {result.returncode}\n{result.stderr}"
        self.outputs.append(result.stdout)
        return result.stdout

    def start(self, command: str) -> dict:
        argv = self.argv(command) + ["--api", "127.0.0.1:0", "--mesh", "127.0.0.1:0"]
        with open(self.log, "ab") as log:
            self.daemon = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

        def serving() -> dict | None:
            assert self.daemon.poll() is None, f"{self.name}'s daemon exited:\n{self.log.read_text()}"
            try:
                info = json.loads((self.home / "daemon.json").read_text())
                return info if httpx.get(info["api_url"] + "/healthz", timeout=5).status_code == 200 else None
            except (OSError, ValueError, httpx.HTTPError):
                return None

        return wait_until(serving, DEADLINE, interval=0.1, message=f"{self.name}'s daemon serving")

    def peers(self) -> dict:
        """What `hyphae peers --json` shows, read straight from the daemon (polled often)."""
        info = json.loads((self.home / "daemon.json").read_text())
        token = (self.home / "admin.token").read_text().strip()
        return httpx.get(info["api_url"] + "/v1/admin/peers", headers={"x-hyphae-admin": token}, timeout=10).json()


def test_the_readme_team_quick_start(tmp_path):
    assert HYPHAE.exists(), f"no `hyphae` console script next to {sys.executable}: install with pip install -e ."
    steps = walkthrough_steps()
    assert [m for m, _ in steps] == ["alice"] * 3 + ["bob"] * 6 + ["alice"] * 2 + ["bob"], steps
    machines = {name: Machine(name, tmp_path / name) for name in ("alice", "bob")}
    token = node_id = None
    try:
        for name, command in steps:
            machine = machines[name]
            exported = _EXPORT.match(command)
            if command.startswith("hyphae up"):
                machine.start(command)
                if all(m.daemon is not None for m in machines.values()):
                    connected = lambda m: [p for p in m.peers()["peers"] if p["state"] == "alive"]  # noqa: E731
                    for m in machines.values():
                        wait_until(lambda: connected(m), FIND_DEADLINE, interval=0.2,
                                   message=f"{m.name} finds its teammate by zeroconf")  # fmt: skip
            elif exported:
                variable, inner = exported.groups()
                machine.env[variable] = machine.run(inner).strip().splitlines()[-1]
            elif command.startswith("hyphae team create"):
                token = machine.run(command).strip().splitlines()[-1]
                assert token.startswith("hyphae1."), token
            elif TOKEN_PLACEHOLDER in command:
                assert token is not None, "the README joins a team before anyone created one"
                machine.run(command.replace(TOKEN_PLACEHOLDER, token))
            elif command.startswith("hyphae connect"):
                snippet = machine.run(command)
                assert "claude mcp add hyphae" in snippet and machine.env["HYPHAE_API_KEY"] in snippet
            elif command.startswith("hyphae beacon add"):
                machine.run(command)
                # A person would look up from the keyboard here; the beacon reaches Alice's node meanwhile.
                alice = machines["alice"]
                wait_until(lambda: alice.peers().get("beacons_known", 0) >= 1, DEADLINE, interval=0.2,
                           message="Bob's beacon known on Alice's node")  # fmt: skip
            elif command.startswith("hyphae store"):
                node_id = machine.run(command).strip().splitlines()[-1]
            elif command.startswith("hyphae inbox"):
                shown = wait_until(lambda: DECISION in machine.run(command) and machine.outputs[-1], 10.0, interval=0.1,
                                   message="the decision in Bob's inbox")  # fmt: skip
                assert "[Decision]" in shown and node_id in shown
            else:
                machine.run(command)

        # What arrived is Alice's decision, as stored on her node, with its provenance.
        assert [p["node_id"] for p in json.loads(machines["bob"].run("hyphae peers --json"))["peers"]] == [
            json.loads((machines["alice"].home / "daemon.json").read_text())["node_id"]]  # fmt: skip
        alice_node = json.loads((machines["alice"].home / "daemon.json").read_text())["node_id"]
        (diff,) = json.loads(machines["bob"].run("hyphae inbox --json"))["diffs"]
        assert (diff["node_id"], diff["content"], diff["cell_type"]) == (node_id, DECISION, "Decision")
        assert diff["origin_node"] == alice_node and diff["hops"] >= 1
        for machine in machines.values():
            doctor = subprocess.run([str(HYPHAE), "doctor", "--json"], env=machine.env, capture_output=True,
                                    text=True, timeout=COMMAND_TIMEOUT)  # fmt: skip
            checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
            # The teammate is there (alive, or briefly suspect if this machine is busy).
            assert checks["peers"]["status"] != "fail" and "no peers" not in checks["peers"]["message"], checks["peers"]
            assert checks["daemon"]["status"] == "ok", checks["daemon"]
    finally:
        stop_processes([m.daemon for m in machines.values() if m.daemon is not None])


FAKE_CLAUDE = """#!{python}
import json, os, sys
with open(os.environ["CLAUDE_ARGS_FILE"], "w") as out:
    json.dump(sys.argv[1:], out)
print("Added stdio MCP server hyphae")
"""


def test_the_readme_one_minute_quick_start_connects_claude_code(tmp_path):
    assert HYPHAE.exists(), f"no `hyphae` console script next to {sys.executable}: install with pip install -e ."
    steps = [command for machine, command in walkthrough_steps(SOLO_SECTION)]
    assert [m for m, _ in walkthrough_steps(SOLO_SECTION)] == ["solo"] * 5, steps
    assert steps[-1].startswith("claude mcp add hyphae"), steps
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "claude").write_text(FAKE_CLAUDE.format(python=sys.executable))
    (tools / "claude").chmod(0o755)
    home, data = tmp_path / "user", tmp_path / "work" / "hyphae-data"  # not the default data dir
    home.mkdir()
    env = {"PATH": os.pathsep.join([str(HYPHAE.parent), str(tools), "/usr/bin", "/bin"]), "HOME": str(home),
           "HYPHAE_HOME": str(data), "NO_COLOR": "1", "CLAUDE_ARGS_FILE": str(tmp_path / "claude-args.json"),
           "LANG": "C.UTF-8"}  # fmt: skip
    outputs = []
    try:
        for command in steps:
            exported = re.match(r"^export (\w+)=", command)
            script = f'{command}; printf "%s" "${exported.group(1)}"' if exported else command
            result = subprocess.run(["bash", "-ec", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                                    timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
            assert result.returncode == 0, f"$ {command}\nexit {result.returncode}\n{result.stderr}"
            if exported:
                env[exported.group(1)] = result.stdout.strip().splitlines()[-1]
            outputs.append(result.stdout)
            if command == "hyphae init":
                config = data / "config.toml"
                config.write_text(config.read_text().replace('listen = "127.0.0.1:7777"', 'listen = "127.0.0.1:0"'))
        assert DECISION in outputs[3]  # recall found it

        # What Claude Code was told, and the server started from that alone, as Claude Code would.
        argv = json.loads((tmp_path / "claude-args.json").read_text())
        split = argv.index("--")
        head, (command, *args) = argv[:split], argv[split + 1:]
        assert head[:3] == ["mcp", "add", "hyphae"] and Path(command).is_absolute() and args == ["mcp"]
        server_env = dict(pair.split("=", 1) for flag, pair in zip(head[3::2], head[4::2]) if flag == "--env")
        assert server_env["HYPHAE_HOME"] == str(data) and server_env["HYPHAE_API_KEY"].startswith("hy_")
        elsewhere = tmp_path / "some-project"
        elsewhere.mkdir()
        requests = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "claude-code", "version": "0"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
             "params": {"name": "recall", "arguments": {"query": "which database do we use for storage"}}},
        ]  # fmt: skip
        served = subprocess.run([command, *args], env={"PATH": "/usr/bin:/bin", "HOME": str(home), **server_env},
                                cwd=elsewhere, input="".join(json.dumps(r) + "\n" for r in requests),
                                capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)  # fmt: skip
        assert served.returncode == 0, served.stderr
        assert "relaying over the local socket" in served.stderr
        answers = {m.get("id"): m for m in map(json.loads, served.stdout.splitlines())}
        assert len(answers[2]["result"]["tools"]) == 11
        assert answers[3]["result"]["structuredContent"]["results"], answers[3]
    finally:
        stopped = subprocess.run([str(HYPHAE), "stop"], env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                                 check=False)  # fmt: skip
        info = read_daemon_json(data)
        if info is not None:  # never leave the daemon `hyphae mcp` started behind
            stop_pid(info["pid"])
    assert stopped.returncode == 0, stopped.stderr
