"""Benchmark: the path a question and a checklist item take through ragkit's files, drawn
from the code as it runs (a script that prints figures, not a test).

    .venv/bin/python eval/bench_callpath.py [--store DIR] [--show]

It ingests the sample NDAs (corpora/nda) into a store (or reads --store), then traces, with
`sys.setprofile`, every call into a ragkit module while `ask` answers one question of one
named NDA, and while `check_item` labels one checklist item of it. Each function counts at
its first call only (a loop is one step of the path). Printed per
path: the visits, the distinct files, how often the path returns to a file it left
("returns") and how many of those are a bounce straight back (A -> B -> A). A path that reads
in one direction (retrieve, generate, the checks in order, the outcome) returns seldom.
`--show` prints the sequence.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)

QUESTION = "How long do the confidentiality obligations survive after the agreement ends?"
DOC = "bonterms-mutual-nda-v1.pdf"
ITEM = "nda-11"  # a hypothesis item of the NDA checklist


def trace(fn) -> list[tuple[str, str, bool]]:
    """The calls between ragkit files while `fn` runs, in order: (caller's file, callee's
    file, whether the callee's file was visited before and is not on the call stack now: the
    path came back to a file it had left). Each function counts at its first call only (a
    loop is one step of the path)."""
    pkg = str(ROOT / "ragkit") + "/"
    seen: set = set()
    visited: set[str] = set()
    edges: list[tuple[str, str, bool]] = []

    def rel(frame) -> str | None:
        f = frame.f_code.co_filename
        return f[len(pkg):] if f.startswith(pkg) else None

    def prof(frame, event, arg):
        if event != "call" or frame.f_code in seen:
            return
        seen.add(frame.f_code)
        callee = rel(frame)
        if callee is None:
            return
        stack, up = [], frame.f_back
        while up is not None:
            r = rel(up)
            if r is not None:
                stack.append(r)
            up = up.f_back
        caller = stack[0] if stack else None
        if caller is not None and caller != callee:
            edges.append((caller, callee, callee in visited and callee not in stack))
        visited.add(callee)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return edges


# the rooms from the floor up: a call into a lower room is the path going down, as it should
FLOOR = {"evidence": 0, "store": 0, "embed": 0, "rerankers": 0, "ingest": 0, "session.py": 0, "config.py": 0,
         "paths.py": 0, "errors.py": 0, "models.py": 0, "backends.py": 0, "generate": 1, "retrieve": 1, "answer": 2,
         "compare": 3}


def room(f: str) -> int:
    return FLOOR.get(f.split("/")[0], 0)


def figures(edges: list[tuple[str, str, bool]]) -> dict:
    """Calls between files, the distinct files, and the calls that come back to a file the
    path had left (not a return to a caller) in the caller's room or above it ("returns":
    the path going sideways or up again; a call down to the floor is not one), and those that
    go straight back to the file that called just before ("bounces": A calls B, then B calls A)."""
    back = [i for i, e in enumerate(edges) if e[2] and room(e[1]) >= room(e[0])]
    bounces = sum(1 for i in back if i and edges[i][1] == edges[i - 1][0] and edges[i][0] == edges[i - 1][1])
    files = {f for e in edges for f in e[:2]}
    upper = sum(1 for i in back if room(edges[i][1]) >= FLOOR["answer"])  # into answer/ or compare/
    return {"calls": len(edges), "files": len(files), "returns": len(back), "returns_into_answer_or_compare": upper,
            "bounces": bounces}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--show", action="store_true")
    args = ap.parse_args()
    from ragkit.answer.ask import ask
    from ragkit.config import load_settings
    from ragkit.session import Session

    store = args.store or Path(tempfile.mkdtemp()) / "store"
    settings = load_settings(store=store, generator={"n_ctx": 2048, "max_tokens": 96})
    if args.store is None:
        from ragkit.ingest import ingest

        ingest([ROOT / "corpora" / "nda"], settings)
    session = Session(settings)
    ask(QUESTION, session, docs=[DOC])  # loads every part once, outside the trace
    paths = {"ask": trace(lambda: ask(QUESTION, session, docs=[DOC]))}
    try:
        from ragkit.compare.checklist import load_checklist
        from ragkit.compare.item_label import check_item

        item = next(i for i in load_checklist("nda")[1] if i.id == ITEM)
        check_item(DOC, item, session)
        paths["check_item"] = trace(lambda: check_item(DOC, item, session))
    except ImportError as e:  # a checkout without the checklist
        print(f"check_item: not traced ({e})", file=sys.stderr)
    for name, seq in paths.items():
        print(name, figures(seq))
        if args.show:
            for caller, callee, back in seq:
                mark = "<-" if back and room(callee) >= room(caller) else "  "
                print(f"  {mark} {caller} -> {callee}")


if __name__ == "__main__":
    main()
