"""Beacon threshold calibration: which cosine threshold lets standing interests catch what they
are about and leave the rest? Run by hand:

    python benchmarks/beacon_calibration.py

Pairs come from benchmarks/data/beacon_pairs.json: each beacon (e.g. "which database do we use for
storage") lists cells that should match it, and every beacon is also scored against unrelated team
facts, which should not. Thresholds 0.20..0.60 are swept, reporting precision, recall and F1.

Matching in the mesh is ``cos >= threshold - slack * E0`` (slack 0.05, E0 = salience x type weight,
at most 1), so a salient cell reaches up to 0.05 below the threshold. The sweep therefore scores both
ends: E0 = 0 (the plain threshold) and E0 = 1 (threshold - 0.05). The recommendation is the best F1
at E0 = 0 among thresholds that catch the reference pair (the storage beacon vs "Use pgvector for
the V1 storage backend.") even at E0 = 0. "spill" is the share of *other* beacons' cells caught:
not an error (topics overlap), but a measure of how widely a beacon casts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import app  # noqa: F401  (first: one BLAS thread per operation, as in the daemon)
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.embedding import load_embedder  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "beacon_pairs.json"
SLACK = 0.05
REFERENCE_PAIR = ("which database do we use for storage", "Use pgvector for the V1 storage backend.")


def scores(positives: np.ndarray, negatives: np.ndarray, threshold: float) -> dict:
    caught, wrong = int((positives >= threshold).sum()), int((negatives >= threshold).sum())
    precision = caught / (caught + wrong) if caught + wrong else 1.0
    recall = caught / len(positives)
    f1 = 2 * precision * recall / (precision + recall) if caught else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "false_matches": wrong}


def main() -> None:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    embedder = load_embedder()
    beacons = [beacon["query"] for beacon in data["beacons"]]
    cells = [cell for beacon in data["beacons"] for cell in beacon["match"]]
    owner = np.array([i for i, beacon in enumerate(data["beacons"]) for _ in beacon["match"]])
    beacon_vectors = embedder.embed(beacons)
    cosine_cells = beacon_vectors @ embedder.embed(cells).T  # (beacons, cells)
    cosine_unrelated = beacon_vectors @ embedder.embed(data["unrelated_facts"]).T
    own = owner[None, :] == np.arange(len(beacons))[:, None]
    positives, others, negatives = cosine_cells[own], cosine_cells[~own], cosine_unrelated.ravel()
    reference = float(cosine_cells[beacons.index(REFERENCE_PAIR[0]), cells.index(REFERENCE_PAIR[1])])

    rows = []
    for threshold in np.round(np.arange(0.20, 0.601, 0.02), 2):
        rows.append({
            "threshold": float(threshold),
            "e0_0": scores(positives, negatives, threshold),
            "e0_1": scores(positives, negatives, threshold - SLACK),
            "spill": float((others >= threshold).mean()),
            "catches_reference": bool(reference >= threshold),
        })  # fmt: skip
    recommended = max((r for r in rows if r["catches_reference"]), key=lambda r: (r["e0_0"]["f1"], r["threshold"]))
    worst = np.unravel_index(cosine_unrelated.argmax(), cosine_unrelated.shape)
    summary = {
        "space": embedder.space,
        "beacons": len(beacons),
        "positive_pairs": len(positives),
        "negative_pairs": len(negatives),
        "reference_pair_cos": reference,
        "positive_cos": {"min": float(positives.min()), "median": float(np.median(positives))},
        "unrelated_cos": {
            "median": float(np.median(negatives)),
            "p95": float(np.percentile(negatives, 95)),
            "max": float(negatives.max()),
            "max_pair": [beacons[worst[0]], data["unrelated_facts"][worst[1]]],
        },
        "recommended": recommended,
        "sweep": rows,
    }
    print(json.dumps(summary, indent=1))
    print(
        "\n| threshold | P (E0=0) | R (E0=0) | F1 (E0=0) | P (E0=1) | R (E0=1) | F1 (E0=1) | spill |"
        "\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    for row in rows:
        low, high = row["e0_0"], row["e0_1"]
        mark = " **recommended**" if row is recommended else ""
        print(
            f"| {row['threshold']:.2f}{mark} | {low['precision']:.2f} | {low['recall']:.2f} | {low['f1']:.2f} "
            f"| {high['precision']:.2f} | {high['recall']:.2f} | {high['f1']:.2f} | {row['spill']:.2f} |"
        )


if __name__ == "__main__":
    main()
