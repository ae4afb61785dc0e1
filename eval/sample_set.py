"""Draw a reproducible sample of a labelled set: N answerable and N unanswerable items
(no gold answer), seeded, in the set's order. For runs that cannot afford every item,
e.g. abstention through generation on CUAD (410 items at about 12 s each here).

    .venv/bin/python eval/sample_set.py eval/sets/cuad.jsonl --per-kind 40 --seed 13 > eval/sets/cuad-abstain-sample.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("set", type=Path)
    ap.add_argument("--per-kind", type=int, default=40, help="items drawn from each kind (answerable, unanswerable)")
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args()
    rows = [json.loads(x) for x in args.set.read_text(encoding="utf-8").splitlines() if x.strip()]
    rng = random.Random(args.seed)
    keep: set[int] = set()
    for kind in (True, False):
        idx = [i for i, r in enumerate(rows) if bool(r.get("answers")) is kind]
        keep.update(rng.sample(idx, min(args.per_kind, len(idx))))
    for i in sorted(keep):
        sys.stdout.write(json.dumps(rows[i], ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
