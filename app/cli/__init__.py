"""``hyphae``: the command line.

Commands that read or write memories act as the agent whose key is in
``HYPHAE_API_KEY``. While a daemon runs for the data dir, every command goes through it
(never around it to the database); ``reindex``, which needs the data dir to itself, says
so and stops. Every read command takes ``--json``. Exit
codes: 0 done, 1 the operation failed, 2 bad usage, 3 no usable data dir or config,
4 not authenticated. Colours and progress bars only on a terminal (``NO_COLOR`` honoured).
"""

from __future__ import annotations

import json
import sys

from node.config import resolve_home
from node.errors import ConfigError, HyphaeError, Unauthenticated
from ..logs import setup_logging
from .parser import build_parser
from .plumbing import EXIT_AUTH, EXIT_CONFIG, EXIT_FAILED, EXIT_USAGE, CliError

__all__ = ["main", "build_parser"]

def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.home = resolve_home(args.home)
    try:
        setup_logging(verbose=args.verbose)  # HYPHAE_LOG_LEVEL, HYPHAE_LOG_FORMAT: see node/logs.py
        try:
            return args.handler(args)
        except BaseExceptionGroup as group:  # one error out of a task of the daemon's nursery
            raise _alone(group) from None
    except CliError as exc:
        print(f"hyphae: {exc}", file=sys.stderr)
        return exc.code
    except Unauthenticated as exc:
        print(f"hyphae: {exc.message}", file=sys.stderr)
        return EXIT_AUTH
    except ConfigError as exc:
        print(f"hyphae: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except HyphaeError as exc:
        where = f" ({exc.field})" if exc.field else ""
        print(f"hyphae: {exc.reason}{where}: {exc.message}", file=sys.stderr)
        return EXIT_FAILED
    except json.JSONDecodeError as exc:
        print(f"hyphae: --metadata is not JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _alone(group: BaseExceptionGroup) -> BaseException:
    """The one error a group holds, however deeply nested; the group itself when it holds more."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error
