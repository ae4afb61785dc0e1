"""Benchmark: checklist labels on ContractNLI rendered8 (a script that prints figures, not a test).

    .venv/bin/python eval/bench_checklist.py --store /tmp/cnli-store --cache runs/bench-checklist.jsonl
    .venv/bin/python eval/bench_checklist.py ... --model qwen2.5-coder-1.5b   # another generator

Each item is asked once through `ragkit.compare.check_item` (the path `ragkit compare`
and `ragkit eval run` take), and what the decision is made from is kept per item: the
options' token log-probabilities on the quoted clause, those on the empty clause (the
calibration prior), and the evidence features of the quote (`ragkit.compare.evidence`).
The variants below are then decided from the same records, so they differ only in the
rule, not in the run:

- option score: "sum" (the rule before: the whole option's probability), "mean" (per
  token), "first" (first token only);
- calibrated or not (contextual calibration on an empty clause);
- Not mentioned from the model, or from the evidence (`compare.not_mentioned`): below the
  thresholds the label is Not mentioned, above them the model chooses Yes or No. The
  checklist's words decide before any threshold, as in `check_item`: a sentence with the
  item's `contrary` wording makes it No, no sentence naming its `terms` Not mentioned.

"as collected" is what `check_item` itself labelled, with the settings of the run.

The thresholds are fitted on the tune NDAs and reported on the other NDAs (--tune, or
--split SEED: rendered8 plus half of the other dev NDAs, the whole dev set's way of choosing
the defaults), so the held-out figures are not fitted to themselves. A record labelled by
the checklist's words (its note: "Yes: the document says", "No: the document says", "Not
mentioned: no sentence") keeps that label under every threshold, as in check_item. The store is built (the 8 rendered
PDFs ingested) when it does not exist; records are appended to --cache and reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time
from pathlib import Path
from types import SimpleNamespace

import ragkit  # noqa: F401  (offline switches)
from ragkit.eval.metrics import nli_scores

ROOT = Path(__file__).resolve().parents[1]
NLI = {"Yes": "Entailment", "No": "Contradiction", "Not mentioned": "NotMentioned"}
TUNE = ("cnli_dev_019.pdf", "cnli_dev_054.pdf", "cnli_dev_440.pdf", "cnli_dev_547.pdf")


def cached(cache: Path) -> dict[str, dict]:
    """The records --cache already holds, by item id (the last one of an id wins)."""
    return {r["id"]: r for r in map(json.loads, cache.read_text().splitlines())} if cache.exists() else {}


def collect(args) -> list[dict]:
    from ragkit.compare import check_item, load_checklist
    from ragkit.config import load_settings
    from ragkit.eval.sets import load_set
    from ragkit.session import Session

    gen = {"model": args.model} if args.model else {}
    settings = load_settings(store=Path(args.store), generator=gen)
    if not Path(args.store).exists():
        from ragkit.ingest import ingest

        ingest(sorted(Path(args.corpus).glob("*.pdf")), settings)
    checklist = {i.id: i for i in load_checklist("nda")[1] if i.hypothesis}
    session = Session(settings)  # the models loaded once; its memo keeps each item's prior
    cache = Path(args.cache)
    done = cached(cache)
    items = [it for it in load_set(Path(args.set)) if not args.docs or it.doc in args.docs]
    out = []
    with cache.open("a") as f:
        for k, it in enumerate(items, 1):
            if it.id in done:
                out.append(done[it.id])
                continue
            check = next(checklist[t] for t in it.tags if t in checklist)
            if args.no_words:  # the rule before the checklist's words (for --steps)
                check = dataclasses.replace(check, terms=[], contrary=[])
            t0 = time.perf_counter()
            finding, r = check_item(it.doc, check, session)
            prior = next((v for key, v in session.memo("compare.priors").items() if key[0] == check.id), None)
            rec = {
                "id": it.id, "doc": it.doc, "item": check.id, "gold": it.label, "model": settings.generator.model,
                "abstained": bool(r.abstained), "tokens": r.choice.token_logprobs if r.choice else None,
                "prior": prior, "evidence": finding.evidence, "quote": finding.quote, "closest": finding.closest, "label": finding.label,
                "section": finding.section, "page": finding.page, "note": finding.note,
                "seconds": round(time.perf_counter() - t0, 2),
            }
            f.write(json.dumps(rec) + "\n")
            f.flush()
            out.append(rec)
            print(f"  [{k}/{len(items)}] {it.id}: {finding.label} (gold {it.label}) {rec['seconds']} s", flush=True)
    return out


def recompute_evidence(recs: list[dict], args) -> None:
    from ragkit.compare import evidence, load_checklist
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.retrieve.search import resolve_docs
    from ragkit.store import open_store

    settings = load_settings(store=Path(args.store))
    docs = open_store(settings, load_embedder(settings), create=False).documents()
    checklist = {i.id: i for i in load_checklist("nda")[1] if i.hypothesis}
    for rec in recs:
        (doc,) = resolve_docs(docs, [rec["doc"]])
        ctx = [SimpleNamespace(doc_id=doc.doc_id, text="")]
        rec["evidence"] = evidence(checklist[rec["item"]], ctx, rec["quote"], settings)


def decide(rec: dict, score: str, calibrate: bool, z: float | None, cov: float | None, no_min: float = 0.5,
           sup: float = 0.0) -> str | None:
    """The label the rule gives a record (the same arithmetic as ragkit.compare.check_item)."""
    import math

    from ragkit.compare import calibrated
    from ragkit.generate.base import option_scores

    if rec["abstained"] or not rec["tokens"]:
        return "NotMentioned"
    if z is not None:
        # the checklist's words decide first (ragkit.compare.check_item): contrary wording
        # in a sentence -> No; no sentence naming the item -> Not mentioned
        if (rec.get("note") or "").startswith("No: the document says"):
            return "Contradiction"
        if (rec.get("note") or "").startswith("Yes: the document says"):
            return "Entailment"
        if (rec.get("note") or "").startswith("Not mentioned: no sentence"):
            return "NotMentioned"
    ev = rec["evidence"] or {}
    if z is not None and ev.get("z") is not None and (
            ev["z"] < z or (ev.get("coverage") or 0.0) < cov or (ev.get("support") or 0.0) < sup):
        return "NotMentioned"
    toks = rec["tokens"]
    prior = rec["prior"] if calibrate else None
    if z is not None:  # on point: the model chooses Yes or No
        toks = {o: v for o, v in toks.items() if o != "Not mentioned"}
        prior = {o: v for o, v in prior.items() if o != "Not mentioned"} if prior else None
    lp = option_scores(toks, score)
    if prior:
        lp = calibrated(lp, option_scores(prior, score))
    if z is not None:
        return "Contradiction" if math.exp(lp["No"]) >= no_min else "Entailment"
    return NLI[max(lp, key=lp.get)]


def steps(recs: list[dict], args) -> None:
    """Replays records collected with --no-words (the labels of the rule before the
    checklist's words) adding one step at a time, the words matched over every sentence
    of the document as check_item matches them. The last step of check_item (the quote
    chosen among the sentences that name a term) changes the quote the model scores, so
    only a collection with the words (the default) measures it."""
    import math

    from ragkit.compare import document_sentences as _document_sentences
    from ragkit.compare import load_checklist
    from ragkit.config import load_settings
    from ragkit.embed import load_embedder
    from ragkit.retrieve.search import resolve_docs
    from ragkit.store import open_store

    settings = load_settings(store=Path(args.store))
    docs = open_store(settings, load_embedder(settings), create=False).documents()
    items = {i.id: i for i in load_checklist("nda")[1] if i.hypothesis}
    sents: dict[str, list[str]] = {}
    for r in recs:
        if r["doc"] not in sents:
            (doc,) = resolve_docs(docs, [r["doc"]])
            sents[r["doc"]] = [u for u, _ in _document_sentences([SimpleNamespace(doc_id=doc.doc_id, text="")], settings)]

    def label(r: dict, words: bool, contrary: bool, no_min: float) -> str:
        it = items[r["item"]]
        named = [u for u in sents[r["doc"]] if it.names_item(u)]
        if contrary and any(it.contrary_in(u) for u in named):
            return "Contradiction"
        was = NLI.get(r["label"], "Unclear")
        if was == "NotMentioned" or (words and it.terms and not named):
            return "NotMentioned"
        lp = {o: sum(v) / len(v) for o, v in r["tokens"].items() if o != "Not mentioned"}
        p_no = math.exp(lp["No"]) / (math.exp(lp["No"]) + math.exp(lp["Yes"]))
        return "Contradiction" if p_no >= no_min else "Entailment"

    print("\n== the checklist's words, one step at a time (records collected with --no-words) ==")
    for part_name, part in (("tune", [r for r in recs if r["doc"] in args.tune]),
                            ("held out", [r for r in recs if r["doc"] not in args.tune]), ("all", recs)):
        if not part:
            continue
        gold = [r["gold"] for r in part]
        for name, rule in (("before (No at 0.55)", (False, False, 0.55)),
                           ("+ no sentence names a term -> Not mentioned", (True, False, 0.55)),
                           ("+ contrary wording -> No", (True, True, 0.55)),
                           ("+ No needs 0.6", (True, True, 0.6))):
            print(line(f"{part_name}: {name}", nli_scores(gold, [label(r, *rule) for r in part])))


RENDERED8 = ("019", "020", "054", "411", "440", "478", "547", "575")  # the NDAs the checklist's words were written on


def split_tune(recs: list[dict], seed: int) -> list[str]:
    """The documents to tune on: the rendered8 NDAs (where the words were written) plus the
    first half of the other NDAs, their ids (cnli-NNN-...) sorted and shuffled with `seed`."""
    import random

    nda = lambda r: r["id"].split("-")[1]  # noqa: E731
    others = sorted({nda(r) for r in recs} - set(RENDERED8))
    random.Random(seed).shuffle(others)
    keep = set(RENDERED8) | set(others[: len(others) // 2])
    return sorted({r["doc"] for r in recs if nda(r) in keep})


def scores(recs: list[dict], **rule) -> dict:
    return nli_scores([r["gold"] for r in recs], [decide(r, **rule) for r in recs])


def line(name: str, s: dict) -> str:
    f1 = {c: s["per_class"][c]["f1"] for c in ("Entailment", "Contradiction", "NotMentioned")}
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    return (f"{name:<44} n={s['n']:<3} acc {fmt(s['accuracy'])}  macroF1 {fmt(s['macro_f1'])}  "
            f"F1 E {fmt(f1['Entailment'])} C {fmt(f1['Contradiction'])} NM {fmt(f1['NotMentioned'])}  "
            f"(majority {fmt(s['majority_accuracy'])})")


# ---------------------------------------------------------------------- the label model beside the word rules


def collect_both(args) -> list[dict]:
    """Each item labelled twice on the product path (`check_item`): by the label model
    (compare.label_model, the checklist's own or --label-model) and by the word rules and
    generator (compare.label_model "off"); one record per item, appended to --cache and reused."""
    from ragkit.compare import check_item, load_checklist
    from ragkit.config import load_settings
    from ragkit.eval.sets import load_set
    from ragkit.session import Session

    # the model alone (compare.words_first off): "both" is replayed from the two runs, as words_first decides
    # (--words-first: the model with the checklist's contrary and no-term wording first, as compare.words_first,
    # without the generator's run; the records' "model" is then that rule)
    settings = load_settings(store=Path(args.store), compare={"label_model": args.label_model, "words_first": args.words_first})
    words = Session(load_settings(store=Path(args.store), compare={"label_model": "off"}))
    model = Session(settings)
    checklist = {i.id: i for i in load_checklist("nda")[1] if i.hypothesis}
    cache = Path(args.cache)
    done = cached(cache)
    items = [it for it in load_set(Path(args.set)) if not args.docs or it.doc in args.docs]
    out = []
    with cache.open("a") as f:
        for k, it in enumerate(items, 1):
            if it.id in done:
                out.append(done[it.id])
                continue
            check = next(checklist[t] for t in it.tags if t in checklist)
            rec = {"id": it.id, "doc": it.doc, "item": check.id, "gold": it.label,
                   "spans": list(it.evidence_all) or ([it.evidence] if it.evidence else [])}
            for name, session in (("model", model), ("words", words)):
                if (name == "words" and args.model_only) or (name == "model" and args.words_only):
                    continue
                t0 = time.perf_counter()
                finding, r = check_item(it.doc, check, session)
                rec[name] = {"label": finding.label, "quote": finding.quote, "closest": finding.closest, "note": finding.note,
                             "confidence": finding.confidence, "scores": finding.scores, "decided_by": finding.decided_by,
                             "seconds": round(time.perf_counter() - t0, 3),
                             "label_s": round(r.timings.get("label_s", 0.0), 3),
                             "retrieve_s": round(r.timings.get("retrieve_s", 0.0), 3)}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            out.append(rec)
            print(f"  [{k}/{len(items)}] {it.id}: " + ", ".join(f"{n} {rec[n]['label']}" for n in ("model", "words") if n in rec)
                  + f" (gold {it.label})", flush=True)
    return out


WORDS_DECIDED = ("No: the document says", "Not mentioned: no sentence")  # compare.words_first: contrary, no term named


def residual(rec: dict) -> bool:
    """The word rules' default Yes: a quote on point, no affirming or contrary wording, and no
    generator deciding (decided_by "evidence", label Yes)."""
    w = rec.get("words") or {}
    return w.get("label") == "Yes" and w.get("decided_by") == "evidence"


def model_yes_no(rec: dict, share: float) -> str:
    """The label model's Yes or No on the sentence it rests on: No when Contradiction's share
    of Entailment + Contradiction reaches `share`."""
    import math

    sc = rec["model"]["scores"]
    e, c = math.exp(sc["Yes"]), math.exp(sc["No"])
    return "Contradiction" if c / (e + c) >= share else "Entailment"


def rule_label(rec: dict, rule: str, share: float = 0.9) -> str:
    """"words": the word rules and generator (compare.label_model "off"); "model": the label
    model alone; "both": the product default (compare.words_first), the checklist's contrary
    wording and "no sentence names the item" where they decide, the model elsewhere;
    "residual": every word rule, the model only where they leave the default Yes (its three
    labels); "residual-yn": there, the model's Yes or No only (`share`)."""
    w = rec.get("words") or {}
    if rule == "words":
        return NLI.get(w.get("label"), "Unclear")
    if rule == "both" and (w.get("note") or "").startswith(WORDS_DECIDED):
        return NLI.get(w["label"], "Unclear")
    if rule in ("residual", "residual-yn"):
        if not residual(rec):
            return NLI.get(w.get("label"), "Unclear")
        return NLI.get(rec["model"]["label"], "Unclear") if rule == "residual" else model_yes_no(rec, share)
    return NLI.get(rec["model"]["label"], "Unclear")


def rule_quote(rec: dict, rule: str, share: float = 0.9) -> str | None:
    w = rec.get("words") or {}
    if rule == "words" or (rule == "both" and (w.get("note") or "").startswith(WORDS_DECIDED)):
        return w.get("quote")
    if rule in ("residual", "residual-yn"):
        lab = rule_label(rec, rule, share)
        if not residual(rec) or lab == "Entailment" and rule == "residual-yn":
            return w.get("quote")
        return rec["model"]["quote"]
    return rec["model"]["quote"]


def report_both(recs: list[dict], parts: list[tuple[str, list[dict]]], shares: tuple[float, ...] = (0.9,)) -> None:
    from ragkit.eval.metrics_text import quote_matches_evidence

    both = all("words" in r and "model" in r for r in recs)
    rules = [("words", None), ("model", None), ("both", None)] if both else \
        [("model", None)] if all("model" in r for r in recs) else [("words", None)]
    if both and all("decided_by" in r["words"] for r in recs):
        rules += [("residual", None)] + [("residual-yn", sh) for sh in shares]
    print("\n== word rules, label model, both (the product path, check_item) ==")
    for name, part in parts:
        if not part:
            continue
        if both and any("decided_by" in r["words"] for r in part):
            res = [r for r in part if residual(r)]
            print(f"{name}: the word rules' default Yes (on point, no wording): {len(res)} of {len(part)} items, gold "
                  + ", ".join(f"{lab} {sum(r['gold'] == lab for r in res)}" for lab in ("Entailment", "Contradiction", "NotMentioned")))
        for rule, sh in rules:
            s = nli_scores([r["gold"] for r in part], [rule_label(r, rule, sh or 0.9) for r in part])
            ec = [r for r in part if r["gold"] != "NotMentioned" and r["spans"]]
            held = sum(bool(quote_matches_evidence(rule_quote(r, rule, sh or 0.9), r["spans"])) for r in ec)
            tag = f"{rule} {sh}" if sh is not None else rule
            print(line(f"{name}: {tag}", s) + f"  quote holds gold (E+C) {held / max(1, len(ec)):.3f} of {len(ec)}")
    if all("words" in r for r in recs):
        w = {}
        for r in recs:
            w[r["doc"]] = w.get(r["doc"], 0.0) + r["words"]["seconds"]
        wd = sorted(w.values())
        print(f"word rules, each item on the product path (retrieval included): per document median {wd[len(wd) // 2]:.2f} s, "
              f"max {wd[-1]:.2f} s")
    if not all("model" in r for r in recs):
        return
    secs = sorted(r["model"]["label_s"] for r in recs)
    per_doc: dict[str, float] = {}
    for r in recs:
        per_doc[r["doc"]] = per_doc.get(r["doc"], 0.0) + r["model"]["label_s"]
    docs = sorted(per_doc.values())
    print(f"\nlabel model beyond retrieval: per item median {secs[len(secs) // 2]:.3f} s; per document (17 items) "
          f"median {docs[len(docs) // 2]:.2f} s, max {docs[-1]:.2f} s")


def write_corpus(folder: Path, set_path: Path) -> None:
    """The NDAs of a set as text files named after the set's `doc` (NAME.txt), from ContractNLI's dev.json."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_ranking import contractnli_corpus  # the 61 dev NDAs as text files, named as the sets name them

    from ragkit.eval.sets import load_set

    every = contractnli_corpus(folder / ".all")
    folder.mkdir(parents=True, exist_ok=True)
    docs = sorted({it.doc for it in load_set(set_path)})
    for d in docs:
        (folder / f"{d}.txt").write_text((every / f"{d}.txt").read_text(encoding="utf-8"), encoding="utf-8")
    import shutil

    shutil.rmtree(every)
    print(f"wrote {len(docs)} NDAs into {folder}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="store with the rendered ContractNLI PDFs (built when missing)")
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared" / "corpora" / "contractnli-dev" / "rendered"))
    ap.add_argument("--set", default=str(ROOT / "eval" / "sets" / "contractnli-rendered8.jsonl"))
    ap.add_argument("--cache", required=True, help="per-item records (jsonl), appended and reused")
    ap.add_argument("--model", default=None, help="generator.model (default: the settings' default)")
    ap.add_argument("--docs", nargs="*", default=None, help="only these NDAs (default: all)")
    ap.add_argument("--cached-only", action="store_true", help="report on the cached records only (no generation)")
    ap.add_argument("--recompute-evidence", action="store_true",
                    help="recompute the evidence features of cached records with the current code (no generation)")
    ap.add_argument("--rule", nargs=4, type=float, default=None, metavar=("Z", "COVERAGE", "SUPPORT", "NO_MIN"),
                    help="also report this rule (compare.on_point_z, on_point_coverage, on_point_support, no_min_confidence)")
    ap.add_argument("--tune", nargs="*", default=list(TUNE), help="NDAs the thresholds are fitted on")
    ap.add_argument("--split", type=int, default=None, metavar="SEED",
                    help="tune on the 8 rendered NDAs plus half of the others (their ids sorted, shuffled with SEED); "
                         "the other half is held out (replaces --tune)")
    ap.add_argument("--no-words", action="store_true",
                    help="collect without the checklist's terms and contrary wording (the rule before them)")
    ap.add_argument("--steps", action="store_true",
                    help="replay --no-words records adding the checklist's words one step at a time")
    ap.add_argument("--label-model", default=None, metavar="NAME|PATH|auto",
                    help="label each item with the label model and with the word rules (compare.label_model off), and "
                         "report words / model / both on --split's parts; --cache holds these records")
    ap.add_argument("--model-only", action="store_true", help="with --label-model: the label model alone (no word-rule run)")
    ap.add_argument("--words-only", action="store_true", help="with --label-model: the word rules alone (records to merge)")
    ap.add_argument("--words-first", action="store_true",
                    help="with --label-model --model-only: the model with compare.words_first on (a cache of its own)")
    ap.add_argument("--shares", nargs="*", type=float, default=[0.5, 0.7, 0.8, 0.9, 0.95],
                    help="with --label-model: the Contradiction shares the residual-yn rule is reported at")
    ap.add_argument("--write-corpus", metavar="DIR", default=None,
                    help="write the dev NDAs of --split's tuning part as text files into DIR (the documents "
                         "`ragkit tune checklist ... eval/sets/contractnli-dev-tune34.jsonl --corpus DIR` ingests) and stop")
    args = ap.parse_args()
    if args.write_corpus:
        write_corpus(Path(args.write_corpus), Path(args.set))
        return
    if args.label_model:
        recs = collect_both(args) if not args.cached_only else [json.loads(x) for x in Path(args.cache).read_text().splitlines()]
        recs = list({r["id"]: r for r in recs}.values())
        tune = set(split_tune(recs, args.split)) if args.split is not None else set(args.tune)
        report_both(recs, [("held out", [r for r in recs if r["doc"] not in tune]), ("tune", [r for r in recs if r["doc"] in tune]),
                           ("all", recs)], tuple(args.shares))
        return
    if args.cached_only:
        recs = [json.loads(x) for x in Path(args.cache).read_text().splitlines()]
        recs = list({r["id"]: r for r in recs}.values())
        recs = [r for r in recs if not args.docs or r["doc"] in args.docs]
    else:
        recs = collect(args)
    if args.recompute_evidence:
        recompute_evidence(recs, args)
    if args.steps:
        steps(recs, args)
    if args.split is not None:
        args.tune = split_tune(recs, args.split)
    model = {r["model"] for r in recs}
    tune = [r for r in recs if r["doc"] in args.tune]
    held = [r for r in recs if r["doc"] not in args.tune]
    print(f"\nmodel {', '.join(sorted(model))}; tune: {len(tune)} items ({', '.join(sorted({r['doc'] for r in tune}))}); "
          f"held out: {len(held)} items ({', '.join(sorted({r['doc'] for r in held}))})")
    print("\n== as collected: the labels check_item gave (the product path, current settings) ==")
    for name, part in (("tune", tune), ("held out", held), ("all", recs)):
        if part:
            print(line(name, nli_scores([r["gold"] for r in part], [NLI.get(r["label"], "Unclear") for r in part])))
    grid_z = [-9.0, 0.0, 0.5, 1.0]
    grid_c = [0.0, 0.1, 0.2]
    grid_s = [0.0, 0.25, 0.3, 0.325, 0.35, 0.375, 0.4, 0.425, 0.45, 0.475, 0.5, 0.55]
    for name, part in (("tune", tune), ("held out", held), ("all", recs)):
        if not part:
            continue
        print(f"\n== {name} ==")
        for score, cal in itertools.product(("sum", "mean", "first"), (False, True)):
            print(line(f"{score}, {'calibrated' if cal else 'raw'}, NM from model", scores(part, score=score, calibrate=cal, z=None, cov=None)))
    # the evidence thresholds: fitted on tune (macro F1), then applied unchanged
    grid_no = [0.5, 0.55, 0.6, 0.7, 1.01]  # P(No) a No label needs on an on-point quote (1.01: never No)
    print("\n== NM from the evidence (thresholds fitted on tune, macro F1) ==")
    for score, cal in itertools.product(("sum", "mean", "first"), (False, True)):
        fits = [(scores(tune, score=score, calibrate=cal, z=z, cov=c, no_min=n, sup=u)["macro_f1"] or 0.0, z, c, n, u)
                for z in grid_z for c in grid_c for n in grid_no for u in grid_s]
        f, z, c, n, u = max(fits)
        for name, part in (("tune", tune), ("held out", held)):
            if part:
                print(line(f"{name}: {score}, {'cal' if cal else 'raw'}, z>={z}, cov>={c}, sup>={u}, No>={n}",
                           scores(part, score=score, calibrate=cal, z=z, cov=c, no_min=n, sup=u)))
    if args.rule:
        z, c, u, n = args.rule
        print("\n== the rule given (--rule Z COVERAGE SUPPORT NO_MIN) ==")
        for score in ("sum", "mean"):
            for cal in (False, True):
                for name, part in (("tune", tune), ("held out", held), ("all", recs)):
                    if part:
                        print(line(f"{name}: {score}, {'cal' if cal else 'raw'}, z>={z}, cov>={c}, sup>={u}, No>={n}",
                                   scores(part, score=score, calibrate=cal, z=z, cov=c, no_min=n, sup=u)))
    secs = [r["seconds"] for r in recs]
    print(f"\nseconds per item (collection, shared cores): median {sorted(secs)[len(secs) // 2]:.1f}, total {sum(secs):.0f}")


if __name__ == "__main__":
    main()
