"""One logging set-up for every ``hyphae`` process: levels, one line per record, no secrets.

The level is ``HYPHAE_LOG_LEVEL`` (``debug``, ``info``, ``warning``, ``error``) when set,
else ``info`` with ``--verbose`` and ``warning`` without. Each record is one line on
stderr, ``key=value`` pairs (logfmt) by default or a JSON object with
``HYPHAE_LOG_FORMAT=json``, so a daemon's log can be grepped by a person and parsed by a
collector alike. Fields passed with ``extra={...}`` become keys of their own.

API keys never reach the log: every line passes :func:`redact`, which masks anything
shaped like a Hyphae key (``hy_...``) or sent as a bearer token or a key header. The
modules keep logging through ``logging.getLogger("hyphae.<part>")`` as before; only
this module decides how records look.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from node.errors import ConfigError

__all__ = ["setup_logging", "LogfmtFormatter", "JsonFormatter", "redact", "LEVELS"]

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
FORMATS = ("text", "json")

_SECRETS = (
    re.compile(r"hy_[A-Za-z0-9_-]{8,}"),  # our API keys: a prefix and 43 URL-safe characters
    re.compile(r"(?i)(?<=bearer )[^\s\"',;]+"),
    re.compile(r"(?i)(?<=x-hyphae-key)([\"']?\s*[:=]\s*[\"']?)[^\s\"',;]+"),
    re.compile(r"(?i)(?<=x-hyphae-admin)([\"']?\s*[:=]\s*[\"']?)[^\s\"',;]+"),
)
MASK = "<redacted>"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def redact(text: str) -> str:
    """``text`` with API keys, bearer tokens and key headers masked."""
    text = _SECRETS[0].sub("hy_" + MASK, text)
    text = _SECRETS[1].sub(MASK, text)
    for pattern in _SECRETS[2:]:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def _fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": redact(record.getMessage()),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            fields[key] = redact(value) if isinstance(value, str) else value
    if record.exc_info:
        fields["exc"] = redact(formatter.formatException(record.exc_info))
    elif record.exc_text:
        fields["exc"] = redact(record.exc_text)
    return fields


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=info logger=hyphae.mesh msg="peer 1a2b is alive"``: one line per record."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in _fields(record, self).items())


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    if text and not re.search(r'[\s"=\\]', text):
        return text
    return json.dumps(text, ensure_ascii=False)  # quoted, with newlines and quotes escaped


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, self), default=str, ensure_ascii=False, separators=(",", ":"))


def setup_logging(verbose: bool = False, *, env: Mapping[str, str] | None = None, stream: TextIO | None = None) -> int:
    """Configure the root logger once for this process; returns the level chosen.

    Raises :class:`ConfigError` for a ``HYPHAE_LOG_LEVEL`` or ``HYPHAE_LOG_FORMAT`` it does
    not know, before changing anything.
    """
    env = os.environ if env is None else env
    level_name = env.get("HYPHAE_LOG_LEVEL", "").strip().lower()
    if level_name and level_name not in LEVELS:
        raise ConfigError(f"HYPHAE_LOG_LEVEL={level_name!r} is not a level; use one of {', '.join(LEVELS)}")
    format_name = env.get("HYPHAE_LOG_FORMAT", "").strip().lower() or "text"
    if format_name not in FORMATS:
        raise ConfigError(f"HYPHAE_LOG_FORMAT={format_name!r} is not a format; use text or json")
    level = LEVELS[level_name] if level_name else logging.INFO if verbose else logging.WARNING
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if format_name == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return level
