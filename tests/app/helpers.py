"""Helpers the CLI tests share."""

from __future__ import annotations


def run_cli(monkeypatch, capsys, argv: list[str], key: str | None) -> tuple[int, str, str]:
    """Run ``hyphae argv`` in this process with ``key`` as HYPHAE_API_KEY (or none):
    ``(exit code, stdout, stderr)``."""
    from app.cli import main

    capsys.readouterr()
    if key is None:
        monkeypatch.delenv("HYPHAE_API_KEY", raising=False)
    else:
        monkeypatch.setenv("HYPHAE_API_KEY", key)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err

