"""Logging: levels from ``--verbose`` and ``HYPHAE_LOG_LEVEL``, one line per record, no keys."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.errors import ConfigError
from app.logs import redact, setup_logging
from node.principals import new_api_key


@pytest.fixture(autouse=True)
def root_logger() -> Iterator[logging.Logger]:
    """Each test may reconfigure the root logger; put pytest's handlers back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_the_level_comes_from_verbose_unless_the_environment_names_one() -> None:
    assert setup_logging(False, env={}, stream=io.StringIO()) == logging.WARNING
    assert setup_logging(True, env={}, stream=io.StringIO()) == logging.INFO
    assert setup_logging(False, env={"HYPHAE_LOG_LEVEL": "DEBUG"}, stream=io.StringIO()) == logging.DEBUG
    assert setup_logging(True, env={"HYPHAE_LOG_LEVEL": "error"}, stream=io.StringIO()) == logging.ERROR


def test_records_are_logfmt_lines_with_extra_fields_and_no_api_key() -> None:
    out = io.StringIO()
    setup_logging(env={"HYPHAE_LOG_LEVEL": "info"}, stream=out)
    key = new_api_key()
    log = logging.getLogger("hyphae.test")
    log.info('agent said "hello"\nwith key %s', key, extra={"peer": "1a2b", "queued": 3})
    log.debug("not at info")
    (line,) = out.getvalue().splitlines()
    assert line.startswith("ts=") and " level=info logger=hyphae.test " in line
    assert 'msg="agent said \\"hello\\"\\nwith key hy_<redacted>"' in line
    assert " peer=1a2b queued=3" in line
    assert key not in out.getvalue()


def test_json_lines_carry_the_same_fields_and_the_traceback() -> None:
    out = io.StringIO()
    setup_logging(env={"HYPHAE_LOG_LEVEL": "warning", "HYPHAE_LOG_FORMAT": "json"}, stream=out)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("hyphae.mesh").exception("send failed", extra={"address": "10.0.0.2:7979"})
    record = json.loads(out.getvalue())
    assert record["level"] == "error" and record["logger"] == "hyphae.mesh" and record["msg"] == "send failed"
    assert record["address"] == "10.0.0.2:7979"
    assert "ValueError: boom" in record["exc"]


@pytest.mark.parametrize(
    "text",
    ["Authorization: Bearer s3cr3t-token", "x-hyphae-key: s3cr3t-token", "{'x-hyphae-admin': 's3cr3t-token'}"],
)
def test_tokens_in_headers_are_masked(text: str) -> None:
    masked = redact(text)
    assert "s3cr3t-token" not in masked and "<redacted>" in masked


@pytest.mark.parametrize("env", [{"HYPHAE_LOG_LEVEL": "loud"}, {"HYPHAE_LOG_FORMAT": "xml"}])
def test_an_unknown_level_or_format_is_an_error_that_changes_nothing(env: dict[str, str], root_logger) -> None:
    before = (list(root_logger.handlers), root_logger.level)
    with pytest.raises(ConfigError) as info:
        setup_logging(env=env, stream=io.StringIO())
    assert next(iter(env)) in info.value.message
    assert (list(root_logger.handlers), root_logger.level) == before


def test_the_cli_refuses_an_unknown_level_with_the_config_exit_code(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "--home", str(tmp_path / "none"), "status"],
        env={"HYPHAE_LOG_LEVEL": "loud", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "HYPHAE_LOG_LEVEL='loud' is not a level" in result.stderr
