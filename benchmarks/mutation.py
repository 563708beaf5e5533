"""Mutation testing of the guard code: which one-line changes would the tests let through?

A habit, not a gate: run it after changing a guard, read the survivors, and for each one
either write the test that kills it or say why it changes nothing (RELIABILITY.md keeps the
last run's list). It runs mutmut (``pip install -e '.[mutation]'``; the settings are under
``[tool.mutmut]`` in pyproject.toml: which files, which tests) on the functions below, not on
whole modules: on a 2-core machine the whole of the six modules is some 6,900 mutants.

    python benchmarks/mutation.py                 # the guard functions (about 900 mutants)
    python benchmarks/mutation.py --only repair   # the groups whose name contains "repair"
    python benchmarks/mutation.py --show          # with each survivor's diff
    python benchmarks/mutation.py --fresh         # forget earlier results (after changing tests)

It prints the counts by outcome and every survivor (and "no tests": code no selected test
runs), and exits 0 whatever survived.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# mutmut names a mutant after its function: module.x_function or module.xǁClassǁmethod.
SEP = "ǁ"
GUARDS: dict[str, list[str]] = {
    # what a frame from the network must pass before anything is believed (mesh/admission.py),
    # and the data plane's check that only a cell's origin forgets it
    "admission": [
        "mesh.admission.x_admit_frame__mutmut_*", "mesh.admission.x_admit_diff__mutmut_*",
        f"mesh.admission.x{SEP}ReplayWindow{SEP}*",
        f"mesh.data_plane.x{SEP}DataPlane{SEP}_forgets_own_cell__mutmut_*",
    ],
    # who sealed a frame: the sender tag only its sender and the recipient can make
    "sender binding": [f"mesh.frame_auth.x{SEP}SenderBinding{SEP}*"],
    # wire verification: the signed bytes and the keys a frame carries
    "wire verification": ["mesh.diffs.x_decode_signed__mutmut_*", f"mesh.diffs.x{SEP}DecodeCache{SEP}key_entry__mutmut_*"],
    # membership: a key is a member's only with the team's proof
    "membership": [f"mesh.membership.x{SEP}Keyring{SEP}*"],
    # repair: what a responder sends, where a requester resumes, what an origin owes
    "repair": ["mesh.repair.*"],
    # the facade's scope checks and what it takes from the mesh
    "facade scope": [
        f"node.service.x{SEP}MemoryService{SEP}{name}__mutmut_*"
        for name in ("_cell_in_scope", "forget", "apply_tombstone", "ingest_remote_many")
    ] + [f"node.inbound.x{SEP}InboundPort{SEP}{name}__mutmut_*" for name in ("apply_tombstone", "store_cells")],
    # the store's connections: durable settings on every one, one reader per thread. Database._commit
    # is left out: nearly every test writes, and its mutants that stop the writer hang each test
    # until its guard (about 3 min a mutant, over an hour for its 52 on 2 cores). Its two promises
    # (no answer before COMMIT; synchronous=FULL) are pinned by tests/node/test_database.py, each
    # seen to fail with the one-line change (RELIABILITY.md, "Blind spots").
    "commit path": [
        "node.store.database.x__connect__mutmut_*", f"node.store.database.x{SEP}Database{SEP}reader__mutmut_*",
    ],
}


def mutmut(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=ROOT, text=True,
                          capture_output=capture, check=False)  # fmt: skip


def results() -> dict[str, str]:
    """Every mutant mutmut knows, by name: its outcome."""
    listed = mutmut("results", "--all", "true", capture=True)
    if listed.returncode != 0:
        sys.exit(f"mutmut results failed:\n{listed.stderr}")
    outcomes = {}
    for line in listed.stdout.splitlines():
        name, sep, outcome = line.strip().rpartition(": ")
        if sep:
            outcomes[name] = outcome
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the guard groups whose name contains this")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    parser.add_argument("--fresh", action="store_true", help="delete mutants/ (earlier results) first")
    options = parser.parse_args()

    groups = {name: patterns for name, patterns in GUARDS.items() if not options.only or options.only in name}
    if not groups:
        sys.exit(f"no guard group matches {options.only!r}: {', '.join(GUARDS)}")
    patterns = [pattern for group in groups.values() for pattern in group]
    if options.fresh:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    started = time.monotonic()
    run = mutmut("run", "--max-children", str(options.max_children), *patterns)
    if run.returncode != 0:
        sys.exit(f"mutmut run exited {run.returncode}")
    minutes = (time.monotonic() - started) / 60

    outcomes = results()
    print(f"\nmutation run over {', '.join(groups)}: {minutes:.1f} min")
    for group, group_patterns in groups.items():
        mine = {n: o for n, o in outcomes.items() if any(fnmatch.fnmatchcase(n, p) for p in group_patterns)}
        counts = collections.Counter(mine.values())
        print(f"\n{group}: {len(mine)} mutants, " + ", ".join(f"{o} {c}" for o, c in sorted(counts.items())))
        for name, outcome in sorted(mine.items()):
            if outcome not in ("killed", "caught by type check"):
                print(f"  {outcome:>9}  {name}")
                if options.show:
                    diff = mutmut("show", name, capture=True).stdout
                    print("\n".join(f"             {line}" for line in diff.splitlines() if line[:2] in ("- ", "+ ")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
