"""`ragkit tune kinds`: a review checklist's kinds model (ragkit.compare.kinds) trained on
CUAD's master_clauses.csv (one row a contract, a column per clause kind holding its gold
excerpts; `txt_file` names the text in txt/ beside it).

1. Each contract's text is split into units (sentences and list items: the splitter
   retrieval uses, `ragkit.evidence.sentences`, paragraph by paragraph); a unit is of a kind
   when more than half of it lies inside one of that kind's gold excerpts (found in the text
   whitespace-insensitively). Contracts named in `--hold-out` files (JSON lists or `{"a":
   [...]}` of txt names, e.g. eval/sets/cuad-review-split.json) are left out whole.
2. Every unit of a kind, and `negatives` units of no kind drawn with the seed, embedded with
   the registry embedder (minilm: what the store's first stage reads).
3. One logistic regression per kind (scikit-learn, L2, C), on all those units; its intercept
   moved by log(negatives drawn / negatives there are), so a logit reads as if every unit had
   been seen. A kind with fewer than 5 units gets no model (a logit of -20).

Written: kinds.npz (W, b), kinds.json (kinds, embedder, options, counts, command), MODEL_CARD.md.
Figures on contracts that trained nothing come from eval/bench_review.py, run through the product.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ragkit.errors import UsageError

LICENCE = "CUAD v1 (The Atticus Project; Hendrycks et al., NeurIPS 2021), CC BY 4.0"


@dataclass
class KindsOptions:
    seed: int = 24
    negatives: int = 40000  # units of no kind drawn for training (at least as many as the positives)
    c: float = 3.0  # inverse L2 strength (chosen on the CUAD tuning contracts of eval/bench_review.py: 0.3 / 1 / 3 / 10)
    min_units: int = 5
    embedder: str = "minilm"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _squash(text: str) -> str:
    return " ".join(text.split())


def held_out_names(files: list[Path]) -> set[str]:
    """Every string in the JSON files (lists, or objects of lists, at any depth): txt names."""
    out: set[str] = set()

    def walk(x) -> None:
        if isinstance(x, str):
            out.add(x)
        elif isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    for f in files:
        try:
            walk(json.loads(Path(f).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"--hold-out {f}: {exc}") from None
    return out


def kind_texts() -> dict[str, str]:
    """Each CUAD kind's own text, as retrieval's kind lane matches a question to it
    (ragkit.retrieve.kinds.kind_asked): its title and CUAD's description, the parenthesis of
    CUAD's question ("Governing Law: Which state/country's law governs the interpretation of
    the contract?")."""
    from ragkit.tune.reranker import CUAD_QUESTIONS

    out = {}
    for title, q in json.loads(CUAD_QUESTIONS.read_text(encoding="utf-8"))["questions"].items():
        inner = q[q.find("(") + 1 : q.rfind(")")] if "(" in q and ")" in q else ""
        out[_slug(title)] = " ".join(f"{title}: {inner}".split()) if inner else title
    return out


def labelled_units(master: Path, held: set[str]) -> tuple[list[str], list[tuple[str, str, set[str]]], int, int]:
    """(kinds, [(contract, unit, its kinds)], contracts read, contracts held out) from CUAD's
    master_clauses.csv, read as `ragkit tune reranker` reads it (ragkit.tune.reranker.read_cuad:
    a query per contract and kind, CUAD's question for the kind, its excerpts)."""
    from ragkit.evidence.sentences import merge_short, split_units
    from ragkit.tune.reranker import CUAD_QUESTIONS, read_cuad, safe_name

    questions = json.loads(CUAD_QUESTIONS.read_text(encoding="utf-8"))["questions"]
    kinds = [_slug(c) for c in questions]
    kind_of = {q: _slug(c) for c, q in questions.items()}
    cuad = read_cuad(Path(master))
    held_names = {safe_name(Path(h).stem) for h in held}
    excerpts: dict[str, list[tuple[str, str]]] = {}
    for q in cuad.queries:
        excerpts.setdefault(q.doc, []).extend((kind_of[q.question], e) for e in q.spans)
    out: list[tuple[str, str, set[str]]] = []
    n = skipped = 0
    for name, text in cuad.texts.items():
        if name in held_names:
            skipped += 1
            continue
        flat = _squash(text)
        spans: list[tuple[int, int, str]] = []
        for kind, g in excerpts.get(name, []):
            g = _squash(g)
            at = flat.find(g) if g else -1
            if at >= 0:
                spans.append((at, at + len(g), kind))
        n += 1
        for para in re.split(r"\n\s*\n", text):
            for u in merge_short(split_units(para)):
                u = _squash(u)
                if len(u.split()) < 3:
                    continue
                at = flat.find(u[:80])
                if at < 0:
                    continue
                a, b = at, at + len(u)
                out.append((name, u, {k for s, e, k in spans if min(b, e) - max(a, s) > 0.5 * (b - a)}))
    return kinds, out, n, skipped


def tune_kinds(master: Path, out: Path, session, opts: KindsOptions, *, held_out: list[Path] | None = None,
               command: str = "", log: Callable[[str], None] = print) -> dict:
    """Train the kinds model into `out`; returns what kinds.json says."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from ragkit.compare.kinds import embedder_for
    from ragkit.models import sha256_file

    t0 = time.perf_counter()
    held = held_out_names(held_out or [])
    kinds, units, n_docs, n_held = labelled_units(master, held)
    pos = [u for u in units if u[2]]
    neg = [u for u in units if not u[2]]
    rng = random.Random(opts.seed)
    rng.shuffle(neg)
    drawn = neg[: max(opts.negatives, len(pos))]
    sample = pos + drawn
    log(f"{n_docs} contracts ({n_held} held out by name), {len(units)} units: "
        f"{len(pos)} of a kind, {len(drawn)} of {len(neg)} of none drawn; embedding {len(sample)} ...")

    emb = embedder_for(opts.embedder, session)
    vecs = []
    step = 256
    for i in range(0, len(sample), step):
        vecs += emb.embed_documents([u for _, u, _ in sample[i : i + step]])
        if (i // step) % 40 == 0:
            el = time.perf_counter() - t0
            log(f"  {i + step}/{len(sample)} units embedded, {el / 60:.1f} min")
    X = np.asarray(vecs, dtype=np.float32)
    shift = math.log(len(neg) / len(drawn)) if drawn else 0.0
    W = np.zeros((len(kinds), X.shape[1]), np.float32)
    b = np.full(len(kinds), -20.0, np.float32)
    counts = {}
    t1 = time.perf_counter()
    for j, k in enumerate(kinds):
        y = np.array([k in u[2] for u in sample], dtype=np.int8)
        counts[k] = int(y.sum())
        if y.sum() < opts.min_units:
            continue
        m = LogisticRegression(C=opts.c, max_iter=2000).fit(X, y)
        W[j] = m.coef_[0]
        b[j] = m.intercept_[0] - shift
    fit_s = time.perf_counter() - t1
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "kinds.npz", W=W, b=b)
    card = {
        "kinds": kinds, "texts": {k: t for k, t in kind_texts().items() if k in kinds},
        "embedder": opts.embedder, "floor": None, "fitted_model_sha256": None,
        "options": {"seed": opts.seed, "negatives": opts.negatives, "c": opts.c, "min_units": opts.min_units},
        "source": Path(master).name, "licence": LICENCE, "contracts": n_docs, "held_out_contracts": n_held,
        "units": len(units), "units_of_a_kind": len(pos), "negatives_drawn": len(drawn), "negatives_total": len(neg),
        "units_per_kind": counts, "fit_s": round(fit_s, 1), "total_s": round(time.perf_counter() - t0, 1),
        "command": command, "kinds_npz_sha256": sha256_file(out / "kinds.npz"),
    }
    (out / "kinds.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
    log(f"wrote {out}/kinds.npz and kinds.json ({len(kinds)} kinds, {card['total_s'] / 60:.1f} min)")
    return card
