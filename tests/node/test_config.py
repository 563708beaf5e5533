"""config.toml: self-documenting on init, strict on read (a typo is an error, never a silent
default), and its [energy] overrides reach the running node."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import trio

from node.config import DEFAULT_BEACON_THRESHOLD, load_config, resolve_home, write_initial_config
from node.embedding import HashedEmbedder
from node.energy import DEFAULT_ENERGY
from node.errors import ConfigError
from app.home import init_home, open_node


def set_config(home: Path, text: str) -> None:
    (home / "config.toml").write_text(text, encoding="utf-8")


def config_with(home: Path, extra: str, *, replacing: tuple[str, ...] = ()) -> None:
    """The initialised config with the ``replacing`` sections removed and ``extra`` appended."""
    text = (home / "config.toml").read_text(encoding="utf-8")
    for section in replacing:
        text, found = re.subn(rf"(?ms)^\[{re.escape(section)}\]\n.*?(?=^\[|\Z)", "", text)
        assert found == 1, section
    set_config(home, text + "\n" + extra + "\n")


def test_init_writes_a_config_that_loads_to_the_defaults(home):
    config = load_config(home)
    assert uuid.UUID(config.tenant_id)
    assert config.home == home
    assert config.api_listen == "127.0.0.1:7777"  # loopback only by default
    assert config.mesh_listen == "0.0.0.0:7979"
    assert config.peers == ()
    assert config.embedder == {"provider": "builtin"}
    assert config.a2a_enabled is False  # the A2A surface is opt-in
    assert config.energy == DEFAULT_ENERGY
    assert config.default_beacon_threshold == DEFAULT_BEACON_THRESHOLD
    assert config.group_commit_ms == 2.0
    assert (config.db_path, config.index_dir, config.key_path) == (home / "hyphae.db", home / "index", home / "node.key")


def test_init_twice_keeps_the_identity(tmp_path):
    home = tmp_path / "h"
    first, created = init_home(home)
    again, created_again = init_home(home)
    assert (created, created_again) == (True, False)
    assert again.tenant_id == first.tenant_id
    assert (home / "node.key").stat().st_mode & 0o077 == 0
    with pytest.raises(ConfigError, match="already exists"):
        write_initial_config(home)


def test_the_commented_energy_defaults_are_the_real_defaults(home):
    """Uncommenting every ``# key = value`` line of [energy] must change nothing."""
    text = (home / "config.toml").read_text(encoding="utf-8")
    energy = text[text.index("[energy]"):]
    uncommented = re.sub(r"(?m)^# (\w+ = [\d.]+)\s*$", r"\1", energy)
    assert uncommented != energy
    set_config(home, text.replace(energy, uncommented))
    assert load_config(home).energy == DEFAULT_ENERGY


def test_energy_overrides_are_read(home):
    config_with(
        home,
        "[energy]\nmax_hops = 9\nmatch_slack = 0.1\npromote_energy = 0.5\n\n"
        "[energy.type_weights]\nFact = 1.0\n\n[energy.half_life_days]\nContext = 1.5\n",
        replacing=("energy",),
    )
    energy = load_config(home).energy
    assert (energy.max_hops, energy.match_slack, energy.promote_energy) == (9, 0.1, 0.5)
    assert energy.type_weights["Fact"] == 1.0 and energy.type_weights["Risk"] == 0.9
    assert energy.half_life_days["Context"] == 1.5 and energy.half_life_days["Task"] == 14.0


async def test_energy_overrides_reach_the_running_node(home, clock):
    config_with(
        home,
        "[energy]\npromote_energy = 0.5\n\n[energy.type_weights]\nFact = 1.0\n\n"
        "[beacons]\ndefault_threshold = 0.8\n",
        replacing=("energy", "beacons"),
    )
    with trio.fail_after(30):
        async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
            alice, _ = await service.add_agent("alice")
            fact = (await service.store(alice, content="a weighty fact", cell_type="Fact", salience=0.55))["node_id"]
            task = (await service.store(alice, content="a light task", cell_type="Task", salience=0.9))["node_id"]
            assert (await service.get_cell(alice, node_id=fact))["layer"] == "L1"  # 0.55 × 1.0 ≥ 0.5
            assert (await service.get_cell(alice, node_id=task))["layer"] == "L0"  # 0.9 × 0.5 < 0.5
            await service.place_beacon(alice, query="anything")
            assert (await service.list_beacons(alice))["beacons"][0]["threshold"] == 0.8


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[node]\ntenant_id = 't'\n[nodes]\nname = 'x'\n", "unknown sections"),
        ("[node]\ntenant_id = 't'\ntenant = 'typo'\n", "unknown keys"),
        ("[node]\nname = 'no tenant'\n", "tenant_id"),
        ("node = 5\n", "must be a table"),
        ("[node]\ntenant_id = 't'\n[api]\nlisten = '127.0.0.1:7777'\nport = 1\n", "unknown keys"),
        ("[node]\ntenant_id = 't'\n[energy]\nmax_hop = 6\n", "max_hop"),
        ("[node]\ntenant_id = 't'\n[energy.type_weights]\nInsight = 1.0\n", "Insight"),
        ("[node]\ntenant_id = 't'\n[energy.type_weights]\nFact = 'heavy'\n", ""),
        ("[node]\ntenant_id = 't'\n[beacons]\ndefault_threshold = 1.5\n", "default_threshold"),
        ("[node\ntenant_id = 't'\n", ""),  # not TOML
        ("[node]\ntenant_id = 't'\n[a2a]\nenabled = 'yes'\n", "[a2a] enabled must be true or false"),
        ("[node]\ntenant_id = 't'\n[a2a]\nenable = true\n", "unknown keys in [a2a]: enable"),
    ],
    ids=["section-typo", "key-typo", "no-tenant", "section-not-table", "api-key-typo", "energy-key-typo",
         "unknown-cell-type", "weight-not-a-number", "threshold-out-of-range", "malformed-toml",
         "a2a-not-a-bool", "a2a-key-typo"],
)
def test_strict_loading_rejects_mistakes_with_a_config_error(home, text, complaint):
    set_config(home, text)
    with pytest.raises(ConfigError) as info:
        load_config(home)
    assert complaint in info.value.message
    assert str(home / "config.toml") in info.value.message  # says which file


@pytest.mark.parametrize(
    "text",
    [
        "[node]\ntenant_id = 't'\n[beacons]\ndefault_threshold = 'high'\n",
        "[node]\ntenant_id = 't'\n[storage]\ngroup_commit_ms = 'fast'\n",
        "[node]\ntenant_id = 't'\n[energy]\nmax_hops = 'six'\n",
        "[node]\ntenant_id = 't'\n[mesh]\npeers = '10.0.0.2:7979'\n",
    ],
    ids=["threshold-string", "group-commit-string", "max-hops-string", "peers-not-a-list"],
)
def test_wrongly_typed_values_are_config_errors_not_crashes_or_silent_garbage(home, text):
    set_config(home, text)
    with pytest.raises(ConfigError):
        load_config(home)


async def test_a_bad_embedder_setting_is_a_config_error(home):
    config_with(home, '[embedder]\nprovider = "hashd"\n', replacing=("embedder",))
    with pytest.raises(ConfigError, match="hashd"):
        with trio.fail_after(30):
            async with open_node(home):
                pass  # pragma: no cover - must not open


def test_a_missing_data_dir_says_to_run_init(tmp_path):
    with pytest.raises(ConfigError, match="hyphae init"):
        load_config(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_resolve_home_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HYPHAE_HOME", str(tmp_path / "from-env"))
    assert resolve_home(tmp_path / "explicit") == tmp_path / "explicit"
    assert resolve_home() == tmp_path / "from-env"
    monkeypatch.delenv("HYPHAE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert resolve_home() == tmp_path / "user" / ".hyphae"
