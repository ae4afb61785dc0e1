"""Benchmark: the generator as reranker (a script that prints figures, not a test).

    .venv/bin/python eval/bench_rerank.py --records /tmp/ragkit-rank/contractnli/records-default.jsonl \
        --set eval/sets/contractnli-dev.jsonl --skip 340 --limit 40

Reads the ranked sources `eval/bench_ranking.py` recorded for each item (the default
retrieval), asks the generator of each source "does this passage answer the question?"
(prompts/rerank_system.txt; the option scores of Yes / No through `choose`, the same
in-process scoring the checklist uses), reorders the sources by P(Yes) (ties keep the
retrieval order), and scores both orders with the eval's own `score_item`: strict MRR and
the gold evidence within the first 1,000 prompt tokens. It prints the reranking's cost
(prompt tokens prefilled and seconds per question) beside what it saves (prompt tokens
before the evidence), so the trade can be read at any engine's prefill speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ragkit  # noqa: E402,F401  (offline switches)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, required=True)
    ap.add_argument("--set", type=Path, required=True)
    ap.add_argument("--skip", type=int, default=0, help="records to leave out first (the tuning part)")
    ap.add_argument("--limit", type=int, default=40, help="items with evidence to rerank")
    ap.add_argument("--model", default=None)
    ap.add_argument("--within", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from ragkit.config import load_settings
    from ragkit.eval.metrics import mrr
    from ragkit.eval.run import score_item
    from ragkit.eval.sets import load_set
    from ragkit.generate import load_generator
    from ragkit.paths import read_prompt
    from ragkit.retrieve.prompt import PromptBuilder
    from ragkit.retrieve.query import search_query
    from ragkit.store import Hit

    settings = load_settings(generator={"model": a.model} if a.model else {})
    gen = load_generator(settings)
    builder = PromptBuilder(gen, n_ctx=settings.generator.n_ctx, max_tokens=8)
    builder.system = read_prompt("rerank_system.txt").strip()
    builder.user_tail = ""
    items = {i.id: i for i in load_set(a.set)}
    recs = [json.loads(x) for x in a.records.read_text(encoding="utf-8").splitlines() if x.strip()][a.skip:]
    rows_before, rows_after, cost_tokens, cost_s = [], [], [], []
    for rec in recs:
        item = items.get(rec["id"])
        if item is None or not item.evidence:
            continue
        if len(rows_before) >= a.limit:
            break
        q = f"Does this passage answer the question: {search_query(item.question)}"
        t0 = time.perf_counter()
        toks = 0
        p_yes = {}
        for c in rec["contexts"]:
            hit = Hit(id=c["chunk_id"], text=c["text"], score=c["score"],
                      meta={"doc_name": c["doc"], "doc_id": "", "chunk_index": c["chunk_index"], "section": c.get("section"),
                            "page_start": c.get("page"), "page_end": c.get("page_end")})
            p = builder.build(q, [hit])
            ch = gen.choose(p.ids, ["Yes", "No"])
            toks += ch.prompt_tokens - ch.cached_tokens
            p_yes[c["chunk_id"]] = ch.logprobs["Yes"]
        cost_s.append(time.perf_counter() - t0)
        cost_tokens.append(toks)
        before = score_item(item, rec, settings.generator.prompt_rate_tok_s)
        order = sorted(rec["contexts"], key=lambda c: (-p_yes[c["chunk_id"]], c["rank"]))
        re_rec = {**rec, "contexts": [{**c, "rank": i, "score": p_yes[c["chunk_id"]]} for i, c in enumerate(order, 1)]}
        after = score_item(item, re_rec, settings.generator.prompt_rate_tok_s)
        rows_before.append(before)
        rows_after.append(after)
        print(f"  {item.id}: rank {before.get('evidence_rank_strict')} -> {after.get('evidence_rank_strict')}, "
              f"{toks} tokens, {cost_s[-1]:.1f} s", file=sys.stderr, flush=True)

    def summary(rows):
        within = [r.get(f"evidence_within_{a.within}_tokens") for r in rows]
        return {"mrr_strict": mrr(r.get("evidence_rank_strict") for r in rows),
                "within": sum(bool(w) for w in within) / max(len(within), 1),
                "tokens_to_evidence_mean": statistics.fmean([r["tokens_to_evidence"] for r in rows if r.get("tokens_to_evidence")] or [0])}

    out = {"n": len(rows_before), "model": gen.name if hasattr(gen, "name") else settings.generator.model,
           "retrieval": summary(rows_before), "reranked": summary(rows_after),
           "rerank_prompt_tokens_mean": statistics.fmean(cost_tokens) if cost_tokens else None,
           "rerank_s_mean": statistics.fmean(cost_s) if cost_s else None}
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        b, r = out["retrieval"], out["reranked"]
        print(f"{out['n']} items, generator {out['model']}")
        print(f"  retrieval order: MRR strict {b['mrr_strict']:.3f}, within {a.within} tokens {b['within']:.3f}, "
              f"tokens to evidence {b['tokens_to_evidence_mean']:.0f}")
        print(f"  reranked:        MRR strict {r['mrr_strict']:.3f}, within {a.within} tokens {r['within']:.3f}, "
              f"tokens to evidence {r['tokens_to_evidence_mean']:.0f}")
        print(f"  cost: {out['rerank_prompt_tokens_mean']:.0f} prompt tokens prefilled and {out['rerank_s_mean']:.1f} s "
              f"per question")
    return 0


if __name__ == "__main__":
    sys.exit(main())
