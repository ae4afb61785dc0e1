"""The data-room review measured as CUAD measures it (ragkit.eval.review_score): every
contract of a set reviewed against the 41 kinds of `prompts/checklists/cuad.toml`
(`ragkit.compare.review.review`, resumable: findings logged per contract in the cache), then
AUPR, precision at 80% / 90% recall, per kind recall and empty cells left empty, per half.

Contracts that trained and chose nothing:
- `cuad10`: the 10 CUAD contracts of ../shared/corpora/cuad-10 (PDF), in the one CUAD split
  (eval/bench_ranking.py's seeded halves: 5 tuning, 5 held out);
- `cuadkept`: 20 contracts of ../shared/corpora/cuad-train that the shipped reranker's
  training never read (its sample of 120 of the 490 is reproduced from training.json's
  options), drawn with seed 24 and split 10 / 10 in eval/sets/cuad-review-split.json.

    .venv/bin/python eval/bench_review.py --sets cuad10,cuadkept --half tune     # choose on these
    .venv/bin/python eval/bench_review.py --sets cuad10,cuadkept --half held     # report, once
    .venv/bin/python eval/bench_review.py --sets cuad10 --half tune --fit-floor  # the review floor

The stores are built in --cache (cuad10 shares eval/bench_ranking.py's CUAD store when
given the same --cache). Retrieval only: nothing is generated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RAGKIT_SHARED_CORPORA", ROOT.parent / "shared" / "corpora"))
SPLIT = ROOT / "eval" / "sets" / "cuad-review-split.json"
SEED = 24


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def kept_out(n: int = 20) -> list[str]:
    """`n` cuad-train text files the shipped reranker's training never read: its sample
    (ragkit.tune.reranker.sample with the options in its training.json) reproduced, the rest
    shuffled with SEED."""
    from ragkit.tune.reranker import read_cuad, safe_name, sample

    opts = json.loads((ROOT / "ragkit/models_data/legal-reranker/training.json").read_text())["options"]
    master = SHARED / "cuad-train" / "master_clauses.csv"
    qs = read_cuad(master)
    used = {q.doc for q in sample(qs.queries, max_docs=opts["max_docs"], per_doc=opts["per_doc"],
                                   unanswerable=opts["unanswerable"], seed=opts["seed"])}
    import csv

    csv.field_size_limit(1 << 30)
    with open(master, encoding="utf-8", newline="") as f:
        files = sorted(r["txt_file"] for r in csv.DictReader(f))
    free = [t for t in files if safe_name(Path(t).stem) not in used]
    random.Random(SEED).shuffle(free)
    return free[:n]


def split() -> dict:
    """The one split of both sets (written once to eval/sets/cuad-review-split.json)."""
    if SPLIT.exists():
        return json.loads(SPLIT.read_text())
    sys.path.insert(0, str(ROOT / "eval"))
    import bench_ranking

    items = bench_ranking.items_for("cuad")
    tune, held = bench_ranking.seeded_halves(items, name="cuad")
    kept = kept_out()
    d = {"_about": "The one split of the data-room review's contracts (eval/bench_review.py): cuad10 as "
                   "eval/bench_ranking.py splits CUAD (seed 24); cuadkept: 20 cuad-train contracts the shipped "
                   "reranker's training never read (seed 24), the first 10 tuning, the last 10 held out.",
         "cuad10": {"tune": sorted(tune), "held": sorted(held)},
         "cuadkept": {"tune": sorted(kept[:10]), "held": sorted(kept[10:])}}
    SPLIT.write_text(json.dumps(d, indent=1) + "\n")
    return d


def store_for(name: str, cache: Path, files: list[str]):
    """Settings over the set's store in `cache`, its contracts ingested when missing."""
    from ragkit.config import load_settings
    from ragkit.ingest import ingest

    folder = cache / ("cuad" if name == "cuad10" else name)
    settings = load_settings(store=folder / "store")
    if name == "cuad10":
        paths = [SHARED / "cuad-10" / "pdf" / f for f in files]
    else:
        paths = [SHARED / "cuad-train" / "txt" / f for f in files]
    marker = folder / "review-built.json"
    have = set(json.loads(marker.read_text())) if marker.exists() else set()
    todo = [p for p in paths if p.name not in have]
    if todo:
        folder.mkdir(parents=True, exist_ok=True)
        log(f"[{name}] ingesting {len(todo)} contracts ...")
        rep = ingest(todo, settings)
        if rep.failed:
            raise SystemExit(f"[{name}] ingest failed for {rep.failed}")
        marker.write_text(json.dumps(sorted(have | {p.name for p in todo})))
    return settings


def gold_for(name: str, files: list[str]) -> dict:
    from ragkit.eval.review_score import gold_from_cuad_qa, gold_from_master_clauses

    if name == "cuad10":
        g = gold_from_cuad_qa(SHARED / "cuad-10" / "cuad_qa.jsonl")
    else:
        g = gold_from_master_clauses(SHARED / "cuad-train" / "master_clauses.csv", set(files))
    return {k: v for k, v in g.items() if k[0] in set(files)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="cuad10,cuadkept")
    ap.add_argument("--half", choices=["tune", "held"], required=True)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/ragkit-rank"))  # bench_ranking.py's: the CUAD store shared
    ap.add_argument("--out", type=Path, default=None, help="write the figures (JSON) here")
    ap.add_argument("--limit", type=int, default=0, help="at most N contracts a set (a quick look)")
    ap.add_argument("--tag", default="default", help="names the findings log (a variant's own)")
    ap.add_argument("--checklist", default="cuad", help="the checklist (a .toml path: e.g. cuad.toml without its "
                    "kind_model, for retrieval and the cross-encoder alone)")
    ap.add_argument("--fit-floor", action="store_true", help="(tuning half only) fit the kinds model's review floor "
                    "(the best F1 of filled cells against cells with gold) and write it to the model's kinds.json")
    ap.add_argument("--kinds", type=Path, default=None, help="the kinds model folder to fit the floor into "
                    "(default: the checklist's, as resolved)")
    args = ap.parse_args()

    from ragkit.compare.checklist import load_checklist
    from ragkit.compare.review import review
    from ragkit.eval.review_score import review_findings, score_review
    from ragkit.session import Session

    sp = split()
    if args.kinds is not None:
        # the review reads this folder's kinds model (a new one, before its pins are written)
        import re as _re

        src = Path(args.checklist) if args.checklist.endswith(".toml") else ROOT / "prompts" / "checklists" / f"{args.checklist}.toml"
        text = _re.sub(r'(?m)^kind_model = .*$', f'kind_model = {json.dumps(str(args.kinds.resolve()))}', src.read_text())
        args.cache.mkdir(parents=True, exist_ok=True)
        args.checklist = str(args.cache / "review-checklist.toml")
        Path(args.checklist).write_text(text)
    _, items = load_checklist(args.checklist)
    kinds = {i.id: i.finding for i in items}
    all_findings: list[dict] = []
    all_gold: dict = {}
    figures: dict = {"half": args.half, "sets": {}}
    for name in args.sets.split(","):
        files = sp[name][args.half][: args.limit or None]
        settings = store_for(name, args.cache, files)
        session = Session(settings)
        t0 = time.perf_counter()
        n = {"done": 0}

        def progress(doc: str, item: str | None) -> None:
            if item is None:
                n["done"] += 1
                el = time.perf_counter() - t0
                log(f"  [{name}] {n['done']}/{len(files)} {doc[:60]}  {el / 60:.1f} min")

        rv = review(files, session, args.checklist, log=args.cache / f"review-{name}-{args.tag}.jsonl", on_progress=progress)
        fj = review_findings(rv.to_json())
        gold = gold_for(name, files)
        s = score_review(fj, gold, kinds)
        s["seconds_per_contract"] = round(sum(c.seconds for c in rv.contracts) / max(1, len(rv.contracts)), 1)
        if rv.floor is not None:
            from ragkit.eval.review_score import cells_at

            s["at_floor"] = cells_at([f for f in fj if f["by"] == "kinds"], gold, rv.floor)
        figures["sets"][name] = s
        all_findings += fj
        all_gold.update(gold)
        log(f"[{name} {args.half}] {s['contracts']} contracts, {s['gold_clauses']} gold clauses: AUPR {s['aupr']:.3f}, "
            f"P@80R {s['precision_at_80_recall']:.3f}, P@90R {s['precision_at_90_recall']:.3f}, "
            f"max recall {s['max_recall']:.3f}, empty left empty {s['empty_left_empty_at_80']}, "
            f"threshold@80R {s['threshold_at_80_recall']}")
    s = score_review(all_findings, all_gold, kinds)
    figures["all"] = s
    floor = next((f["at_floor"]["floor"] for f in figures["sets"].values() if "at_floor" in f), None)
    if floor is not None:
        from ragkit.eval.review_score import cells_at

        s["at_floor"] = cells_at([f for f in all_findings if f["by"] == "kinds"], all_gold, floor)
        log(f"[all {args.half}] cells filled at the floor {floor}: {s['at_floor']}")
    if args.fit_floor:
        if args.half != "tune":
            raise SystemExit("--fit-floor reads the tuning half only")
        from ragkit.eval.review_score import cell_floor
        from ragkit.models import resolve, sha256_file

        floor, how = cell_floor([f for f in all_findings if f.get("by", "kinds") == "kinds"], all_gold)
        folder = Path(items[0].kind_model) if Path(items[0].kind_model).exists() else resolve(items[0].kind_model, "kinds-model", args.cache)
        meta_path = Path(folder) / "kinds.json"
        meta = json.loads(meta_path.read_text())
        meta.update(floor=None if floor is None else round(floor, 4),
                    fitted_model_sha256=sha256_file(Path(folder) / "kinds.npz"),
                    floor_fitted=f"eval/bench_review.py --sets {args.sets} --half tune --fit-floor: the best F1 of filled "
                                 f"cells against cells with gold over {how.get('cells')} cells of the tuning contracts: {how}")
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        log(f"floor {floor} written to {meta_path}: {how}")
    log(f"[all {args.half}] {s['contracts']} contracts, {s['gold_clauses']} gold clauses: AUPR {s['aupr']:.3f}, "
        f"P@80R {s['precision_at_80_recall']:.3f}, P@90R {s['precision_at_90_recall']:.3f}, max recall {s['max_recall']:.3f}, "
        f"empty left empty {s['empty_left_empty_at_80']}, threshold@80R {s['threshold_at_80_recall']}")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
