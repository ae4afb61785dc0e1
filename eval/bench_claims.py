"""How often the claim check calls a claim supported that its sources do not say.

ContractNLI's hypotheses are claims a lawyer wrote about each NDA, labelled against the
document: Entailment (the NDA says it: the claim should be supported), Contradiction (the
NDA says otherwise: a garbled claim, sharing most of its words with the clause) and
NotMentioned (the NDA says nothing of it: an invented claim). Each hypothesis is checked
as an answer's claim is: the item's question retrieved over its NDA by the product
(`retrieve`), then `ragkit.answer.claims.attribute` ties the hypothesis to a sentence of
the prompt's sources. Reported per label: the share called supported, and for Entailment
whether the sentence cited holds the gold evidence. Beside it, the trained cross-encoder's
score of (claim, cited sentence) as a second test: a floor fitted on the tuning NDAs
(eval/sets/contractnli-dev-tune34.jsonl, the highest that keeps 95% of the supported
Entailment claims), reported on the 27 held-out NDAs.

    .venv/bin/python eval/bench_claims.py [--cache /tmp/ragkit-rank] [--limit N] [--json]

The store is eval/bench_ranking.py's ContractNLI store under --cache (built by it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {"tune": ROOT / "eval/sets/contractnli-dev-tune34.jsonl", "held": ROOT / "eval/sets/contractnli-dev-held27.jsonl"}
DEV = ROOT.parent / "shared/corpora/contractnli-dev/dev.json"
KEEP = 0.95  # the floor keeps this share of the tuning half's supported Entailment claims


def hypotheses() -> dict[str, str]:
    return {k: v["hypothesis"] for k, v in json.loads(DEV.read_text(encoding="utf-8"))["labels"].items()}


def measure(cache: Path, limit: int | None) -> list[dict]:
    sys.path.insert(0, str(ROOT / "eval"))
    import bench_ranking as br

    from ragkit.answer.claims import attribute
    from ragkit.eval.metrics_text import quote_matches_evidence
    from ragkit.eval.sets import load_set
    from ragkit.retrieve import retrieve

    hyp = hypotheses()
    settings = br.settings_for("contractnli", cache)
    session = br.session_for(settings)
    items = {half: load_set(path)[:limit] if limit else load_set(path) for half, path in SETS.items()}
    br.prime_queries(settings, [i for its in items.values() for i in its])
    br.prime_reranker(settings, br.memo_path(settings, cache, "contractnli"))
    rows = []
    n_all = sum(map(len, items.values()))
    for half, its in items.items():
        for it in its:
            key = next(t for t in it.tags if t.startswith("nda-"))
            claim = hyp[key]
            r = retrieve(it.question, session, [it.doc])
            (c,) = attribute(claim, r.prompt.contexts, session.embedder) or [None]
            cited = c.citations[0].quote if c is not None and c.citations else None
            best = None
            if c is not None:
                # the sentence the check cites, or (unsupported) the one it found nearest
                from ragkit.evidence.sentences import split_sentences

                sents = [s for ctx in r.prompt.contexts for s in split_sentences(ctx.text)]
                ce = session.reranker.score(claim, sents) if sents else []
                best = max(ce) if ce else None
                cited_ce = session.reranker.score(claim, [cited])[0] if cited else None
            spans = list(it.evidence_all) or ([it.evidence] if it.evidence else [])
            rows.append({"half": half, "id": it.id, "label": it.label, "claim": claim, "supported": bool(c and c.supported),
                         "support": c.support if c else None, "cited": cited, "cited_ce": cited_ce if c else None,
                         "best_ce": best, "cited_gold": bool(cited and spans and quote_matches_evidence(cited, spans)),
                         "missing_names": list(c.missing_names) if c is not None else []})
            if len(rows) % 100 == 0:
                print(f"{len(rows)}/{n_all}", file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict]) -> dict:
    tune_pos = sorted(r["cited_ce"] for r in rows if r["half"] == "tune" and r["label"] == "Entailment" and r["supported"])
    floor = tune_pos[int((1 - KEEP) * len(tune_pos))] if tune_pos else None
    out: dict = {"floor": floor, "keep": KEEP}
    for half in ("held", "tune"):
        h = {}
        for label in ("Entailment", "Contradiction", "NotMentioned"):
            rs = [r for r in rows if r["half"] == half and r["label"] == label]
            if not rs:
                continue
            sup = [r for r in rs if r["supported"]]
            both = [r for r in sup if floor is not None and r["cited_ce"] is not None and r["cited_ce"] >= floor]
            h[label] = {"n": len(rs), "ndas": len({r["id"].rsplit("-nda-", 1)[0] for r in rs}),
                        "supported_without_missing_names": sum(not r.get("missing_names") for r in sup), "supported": len(sup), "supported_with_ce_floor": len(both),
                        "cited_gold": sum(r["cited_gold"] for r in sup)}
        out[half] = h
        out[f"{half}_ndas"] = len({r["id"].rsplit("-nda-", 1)[0] for r in rows if r["half"] == half})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/ragkit-rank"))
    ap.add_argument("--limit", type=int, default=None, help="the first N items of each half (default: all; 150 takes "
                    "about 9 NDAs a half and 10 minutes)")
    ap.add_argument("--from-rows", action="store_true", help="report the rows of the last run (claims-rows.jsonl)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    path = a.cache / "claims-rows.jsonl"
    if a.from_rows:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        rows = measure(a.cache, a.limit)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    res = report(rows)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"\nclaims: ContractNLI hypotheses checked as answers' claims; cross-encoder floor {res['floor']:.2f} "
          f"(keeps {KEEP:.0%} of the tuning half's supported Entailment claims)")
    for half in ("held", "tune"):
        print(f"  {'HELD-OUT' if half == 'held' else 'tuning'} ({res[half + '_ndas']} NDAs)")
        for label, v in res[half].items():
            what = {"Entailment": "says it", "Contradiction": "garbled", "NotMentioned": "invented"}[label]
            print(f"    {label:13s} ({what}): supported {v['supported']}/{v['n']} = {v['supported'] / v['n']:.3f}; "
                  f"with the cross-encoder floor {v['supported_with_ce_floor']}/{v['n']} = "
                  f"{v['supported_with_ce_floor'] / v['n']:.3f}" + (
                      f"; cited sentence holds gold {v['cited_gold']}/{v['supported']}" if label == "Entailment" else "")
                  + f"; with a name its source lacks as a veto {v['supported_without_missing_names']}/{v['n']}")


if __name__ == "__main__":
    main()
