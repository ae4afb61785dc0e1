"""Benchmark: how many chunks carry a section path a reader would call wrong (a script that
prints figures, not a test). Parsing and chunking only (the embedder's tokenizer counts
the tokens; nothing is embedded), so it runs in a minute.

    .venv/bin/python eval/bench_paths.py                 # financebench-dev, the SEC 10-Qs, CUAD-10
    .venv/bin/python eval/bench_paths.py --examples 5    # and five wrong paths of each set

A path component is wrong when it is one of these (the shapes found in the sources shown
for long filings and contracts, issue 56):

- a table-of-contents entry: a title followed by its page number(s), "Item 8. Financial
  Statements and Supplementary Data 116", "GLOSSARY 114 29", "12. CONFIDENTIALITY 12 13";
- no word at all: "TM TM TM TM ® ®";
- a wrapped line of a sentence or table read as a numbered clause: a number followed by a
  lowercase word or a sign, "19.7 percent, respectively", "3.900 % July 2032 $ 1,250",
  "Section 12 of the Exchange Act) ...".

The shapes are counted over every chunk of each document (a chunk's path is what its
citation shows), with the share per set.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)

SHARED = Path(os.environ.get("RAGKIT_SHARED_CORPORA", ROOT.parent / "shared" / "corpora"))
SETS = {
    "financebench-dev": "financebench-dev/pdfs",
    "sec-10q": "sec-10q-docugami/docs",
    "cuad-10": "cuad-10/pdf",
}
_LABEL = r"(?:(?:ARTICLE|Article|SECTION|Section|PART|Part|ITEM|Item|NOTE|Note|SCHEDULE|Schedule|EXHIBIT|Exhibit)\s+[\dIVXLC]+[A-Z]?(?:\.\d+)*\.?|\d{1,3}(?:\.\d{1,3})*\.?)"
WRONG = [
    # a title (beyond its own label "ARTICLE 1", "Item 8.") then page number(s)
    ("contents entry", re.compile(rf"^(?:{_LABEL}\s+)?[^\W\d_]{{3}}.*?(?:\s*[.…·]{{2,}}\s*|\s+)\d{{1,3}}(?:\s+\d{{1,3}})*$")),
    ("no word", re.compile(r"^(?!.*[^\W\d_]{3}).*$")),
    ("wrapped line", re.compile(r"^(?:(?:Section|SECTION|Article|ARTICLE)\s+)?\d[\d.,]*\s*(?:[a-z]|[%$])")),
]


def wrong_shape(component: str) -> str | None:
    c = component.strip()
    # the document's root (no heading yet), a bare "ARTICLE 1" or "Section 8" (a heading's own
    # number), a clause whose title is redacted ("8.3.4 [***]"): all as the document has them
    if not c or re.fullmatch(_LABEL, c) or re.fullmatch(rf"(?:{_LABEL}\s+)?[\[\]*;. ]+", c):
        return None
    for name, pat in WRONG:
        if pat.search(c):
            return name
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--examples", type=int, default=0)
    args = ap.parse_args()

    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.ingest.loaders import load
    from ragkit.ingest.sections import build_sections, chunk_sections

    embedder = load_embedder(load_settings())
    print("| set | documents | chunks | chunks with a wrong path | share | contents entry | no word | wrapped line |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.sets.split(","):
        folder = SHARED / SETS[name]
        files = sorted(p for p in folder.rglob("*") if p.suffix.lower() == ".pdf")
        n_chunks = n_wrong = 0
        by_shape = {s: 0 for s, _ in WRONG}
        examples: list[str] = []
        for f in files:
            chunks = chunk_sections(build_sections(load(f)), embedder.count_tokens, embedder.max_tokens)
            for c in chunks:
                n_chunks += 1
                shapes = {wrong_shape(p) for p in c.section.split(" > ")} - {None}
                if shapes:
                    n_wrong += 1
                    for s in shapes:
                        by_shape[s] += 1
                    if len(examples) < args.examples:
                        examples.append(f"{f.name}: {c.section}")
        share = n_wrong / n_chunks if n_chunks else 0.0
        print(f"| {name} | {len(files)} | {n_chunks} | {n_wrong} | {share:.3f} | "
              + " | ".join(str(by_shape[s]) for s, _ in WRONG) + " |")
        for e in examples:
            print(f"    {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
