"""Regenerate every converted set in eval/sets/ from the shared corpora.

    .venv/bin/python eval/convert_all.py [--corpora DIR]

The hand-written sets (nda-demo.jsonl, fda-guidance.jsonl) are not touched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragkit.errors import RagkitError  # noqa: E402
from ragkit.eval.sets import CONVERTERS, convert, write_set  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpora", type=Path, default=None, help="the shared corpora folder (default ../shared/corpora)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "eval" / "sets")
    args = ap.parse_args()
    for name in CONVERTERS:
        try:
            n = write_set(convert(name, args.corpora), args.out_dir / f"{name}.jsonl")
        except RagkitError as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: {n} questions -> {args.out_dir / (name + '.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
