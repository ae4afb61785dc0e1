"""`ragkit tune checklist | reranker | embedder SET... --out DIR`: train the models ragkit ships on labelled documents."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from ragkit.commands._common import JsonOpt, command_errors, err, print_json

tune_app = typer.Typer(help="Train the models ragkit ships on your own labelled documents.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(tune_app, name="tune")


@tune_app.command("checklist")
def checklist_cmd(
    sets: list[Path] = typer.Argument(..., help="labelled sets: ContractNLI .json files (texts inside) or eval sets .jsonl "
                                                  "(their documents given with --corpus)"),
    out: Path = typer.Option(..., "--out", help="folder the model is written to (model.onnx, tokenizer.json, "
                                                 "label_model.json, MODEL_CARD.md); its work/ subfolder keeps the store"),
    checklist: str = typer.Option("nda", "--checklist", help="built-in checklist name or a .toml path"),
    corpus: Optional[list[Path]] = typer.Option(None, "--corpus", help="documents of the .jsonl sets (files or folders)"),
    base: Optional[str] = typer.Option(None, "--base", help="what training starts from: minilm (MiniLM-L6, the default), "
                                                           "a registry cross-encoder (legal-minilm-l12, ms-marco-minilm-l12) "
                                                           "or a BERT folder"),
    epochs: float = typer.Option(1.0, "--epochs"),
    seed: int = typer.Option(24, "--seed"),
    choose_share: float = typer.Option(0.15, "--choose-share", min=0.0, max=0.5,
                                       help="share of the documents, chosen by the seed, that train nothing and choose the threshold"),
    choose_from: Optional[Path] = typer.Option(None, "--choose-from", help="one of SETS: the choosing documents are drawn "
                                               "from its documents only (the ones most like those the model will label); "
                                               "default: from all"),
    candidates: int = typer.Option(24, "--candidates", min=1, help="sentences per item the model reads"),
    max_length: int = typer.Option(160, "--max-length", min=32, max=512),
    batch_size: int = typer.Option(16, "--batch-size", min=1),
    as_json: bool = JsonOpt,
) -> None:
    """Train a label model (Yes / No / Not mentioned) for a checklist: fp32 fine-tuning of a
    cross-encoder on the gold evidence sentences, ONNX INT8 export, threshold chosen on
    documents that trained nothing, and a model card. Point `compare.label_model` (or the
    checklist's `label_model`) at OUT to use it."""
    from ragkit.config import load_settings
    from ragkit.session import Session
    from ragkit.tune.checklist import TuneOptions, tune_checklist
    from ragkit.tune.training import shown_path

    with command_errors(as_json):
        settings = load_settings(store=out / "work" / "store")
        opts = TuneOptions(checklist=checklist, base=base, epochs=epochs, seed=seed,
                           choose_share=choose_share, choose_from=str(choose_from) if choose_from else None,
                           candidates=candidates, max_length=max_length, batch_size=batch_size)
        # the command as its options resolved (whatever the caller's argv), for the model card
        command = " ".join(["ragkit tune checklist", *map(shlex.quote, map(shown_path, sets)), "--out", shlex.quote(shown_path(out)),
                            *(a for c in corpus or [] for a in ("--corpus", shlex.quote(shown_path(c)))),
                            "--checklist", shlex.quote(checklist), *(("--base", shlex.quote(base)) if base else ()),
                            "--epochs", str(epochs), "--seed", str(seed), "--choose-share", str(choose_share),
                            *(("--choose-from", shlex.quote(shown_path(choose_from))) if choose_from else ()), "--candidates", str(candidates), "--max-length", str(max_length), "--batch-size", str(batch_size)])
        card = tune_checklist(sets, out, Session(settings), opts, corpus=corpus, command=command,
                              log=lambda m: err.print(m, highlight=False, markup=False))
        if as_json:
            print_json(card)
        else:
            c = card["chosen_on"] or {}
            err.print(f"wrote {out} ({card['size_mb']} MB): threshold {card['threshold']}, on the choosing documents "
                      f"accuracy {c.get('accuracy')}, macro F1 {c.get('macro_f1')}; training {card['train_s'] / 60:.1f} min",
                      highlight=False, markup=False)


@tune_app.command("reranker")
def reranker_cmd(
    sets: list[Path] = typer.Argument(..., help="labelled sets: CUAD's master_clauses.csv (texts in txt/ beside it), "
                                                  "ContractNLI .json files (texts inside) or eval sets .jsonl "
                                                  "(their documents given with --corpus)"),
    out: Path = typer.Option(..., "--out", help="folder the model is written to (model.onnx, tokenizer.json, "
                                                 "reranker.json, MODEL_CARD.md, training.json); its work/ subfolder keeps the store"),
    corpus: Optional[list[Path]] = typer.Option(None, "--corpus", help="documents of the .jsonl sets (files or folders)"),
    base: str = typer.Option("ms-marco-minilm-l12", "--base", help="what training starts from: ms-marco-minilm-l12 (the "
                                                                   "shipped reranker), minilm (MiniLM-L6) or a BERT folder"),
    epochs: float = typer.Option(1.0, "--epochs"),
    seed: int = typer.Option(24, "--seed"),
    held_share: float = typer.Option(0.1, "--held-share", min=0.0, max=0.5,
                                     help="share of the documents, chosen by the seed, that train nothing and give the card's figures"),
    max_docs: int = typer.Option(0, "--max-docs", min=0, help="documents of each set, sampled with the seed (0: all)"),
    per_doc: int = typer.Option(8, "--per-doc", min=1, help="answerable questions per document"),
    unanswerable: float = typer.Option(0.25, "--unanswerable", min=0.0, help="unanswerable questions per answerable one"),
    pool: int = typer.Option(20, "--pool", min=1, help="candidates retrieved per question, whose passages make the pairs"),
    negatives: int = typer.Option(6, "--negatives", min=0, help="hard negatives per question"),
    max_length: int = typer.Option(256, "--max-length", min=32, max=512),
    batch_size: int = typer.Option(16, "--batch-size", min=1),
    lr: float = typer.Option(2e-5, "--lr"),
    as_json: bool = JsonOpt,
) -> None:
    """Fine-tune the reranker (a cross-encoder) on labelled questions: pools retrieved by
    ragkit itself over each question's document, gold passages against hard negatives, fp32
    training, ONNX INT8 export, figures on held-out documents and a model card. Point
    `retrieve.rerank_model` at OUT to use it."""
    from ragkit.config import load_settings
    from ragkit.session import Session
    from ragkit.tune.reranker import RerankTuneOptions, tune_reranker
    from ragkit.tune.training import shown_path

    with command_errors(as_json):
        settings = load_settings(store=out / "work" / "store")
        opts = RerankTuneOptions(base=base, epochs=epochs, seed=seed, held_share=held_share, max_docs=max_docs,
                                 per_doc=per_doc, unanswerable=unanswerable, pool=pool, negatives=negatives,
                                 max_length=max_length, batch_size=batch_size, lr=lr)
        command = " ".join(["ragkit tune reranker", *map(shlex.quote, map(shown_path, sets)), "--out", shlex.quote(shown_path(out)),
                            *(a for c in corpus or [] for a in ("--corpus", shlex.quote(shown_path(c)))),
                            "--base", shlex.quote(base), "--epochs", str(epochs), "--seed", str(seed),
                            "--held-share", str(held_share), "--max-docs", str(max_docs), "--per-doc", str(per_doc),
                            "--unanswerable", str(unanswerable), "--pool", str(pool), "--negatives", str(negatives),
                            "--max-length", str(max_length), "--batch-size", str(batch_size), "--lr", str(lr)])
        card = tune_reranker(sets, out, Session(settings), opts, corpus=corpus, command=command,
                             log=lambda m: err.print(m, highlight=False, markup=False))
        if as_json:
            print_json(card)
        else:
            t = (card["held_out"] or {}).get("trained") or {}
            s = (card["held_out"] or {}).get("start") or {}
            err.print(f"wrote {out} ({card['size_mb']} MB); on {len(card['held_documents'])} held-out documents gold first "
                      f"{s.get('gold_first')} -> {t.get('gold_first')}, MRR {s.get('mrr')} -> {t.get('mrr')}; "
                      f"training {card['train_s'] / 60:.1f} min", highlight=False, markup=False)


@tune_app.command("embedder")
def embedder_cmd(
    sets: list[Path] = typer.Argument(..., help="labelled sets with their texts: CUAD's master_clauses.csv (texts in txt/ "
                                                  "beside it) or ContractNLI .json files (texts inside)"),
    out: Path = typer.Option(..., "--out", help="folder the model is written to (model/, a sentence-transformers folder "
                                                 "for embed.model; training.json); its work/ subfolder keeps the chunked texts"),
    base: Optional[str] = typer.Option(None, "--base", help="what training starts from: minilm (the default embedder) or a "
                                                           "sentence-transformers folder"),
    epochs: float = typer.Option(1.0, "--epochs"),
    seed: int = typer.Option(24, "--seed"),
    held_share: float = typer.Option(0.1, "--held-share", min=0.0, max=0.5,
                                     help="share of the documents, chosen by the seed, that train nothing and give the figures"),
    max_docs: int = typer.Option(300, "--max-docs", min=0, help="documents of each set, sampled with the seed (0: all)"),
    per_doc: int = typer.Option(6, "--per-doc", min=1, help="answerable questions per document"),
    max_length: int = typer.Option(256, "--max-length", min=32, max=512),
    batch_size: int = typer.Option(32, "--batch-size", min=2),
    lr: float = typer.Option(3e-5, "--lr"),
    as_json: bool = JsonOpt,
) -> None:
    """Fine-tune the embedder (retrieval's first stage) on labelled questions: each
    question's gold chunk against the best BM25 chunk of its document that holds no gold and
    the batch's other passages, fp32, figures on held-out documents. Point `embed.model` at
    OUT/model and ingest into a new store to use it (a store keeps its embedder's vectors)."""
    from ragkit.config import load_settings
    from ragkit.session import Session
    from ragkit.tune.embedder import EmbedTuneOptions, tune_embedder
    from ragkit.tune.training import shown_path

    with command_errors(as_json):
        settings = load_settings(store=out / "work" / "store")
        opts = EmbedTuneOptions(max_docs=max_docs, per_doc=per_doc, held_share=held_share, epochs=epochs,
                                batch_size=batch_size, lr=lr, max_length=max_length, seed=seed, base=base)
        command = " ".join(["ragkit tune embedder", *map(shlex.quote, map(shown_path, sets)), "--out", shlex.quote(shown_path(out)),
                            *(("--base", shlex.quote(base)) if base else ()), "--epochs", str(epochs), "--seed", str(seed),
                            "--held-share", str(held_share), "--max-docs", str(max_docs), "--per-doc", str(per_doc),
                            "--max-length", str(max_length), "--batch-size", str(batch_size), "--lr", str(lr)])
        card = tune_embedder(sets, out, Session(settings), opts, command=command,
                             log=lambda m: err.print(m, highlight=False, markup=False))
        if as_json:
            print_json(card)
        else:
            b, t = card["held_out_figures"]["base"], card["held_out_figures"]["trained"]
            err.print(f"wrote {out / 'model'}; on {card['documents']['held_out']} held-out documents gold chunk in the top 10 "
                      f"{b['top10']} -> {t['top10']}, MRR {b['mrr']} -> {t['mrr']}; training {card['training_minutes']} min",
                      highlight=False, markup=False)


@tune_app.command("kinds")
def kinds_cmd(
    master: Path = typer.Argument(..., help="CUAD's master_clauses.csv (contract texts in txt/ beside it)"),
    out: Path = typer.Option(..., "--out", help="folder the model is written to (kinds.npz, kinds.json)"),
    hold_out: Optional[list[Path]] = typer.Option(None, "--hold-out", help="JSON files naming contracts (txt names) left "
                                                  "out of training, e.g. eval/sets/cuad-review-split.json"),
    seed: int = typer.Option(24, "--seed"),
    negatives: int = typer.Option(40000, "--negatives", min=1000, help="units of no kind drawn for training"),
    c: float = typer.Option(3.0, "--c", min=1e-4, help="inverse L2 strength of each kind's logistic regression"),
    as_json: bool = JsonOpt,
) -> None:
    """Train a review checklist's kinds model: one logistic regression per clause kind over
    the embeddings of contract sentences labelled by CUAD's gold excerpts. Name OUT as the
    checklist's `kind_model` to use it (cuad.toml names the shipped `cuad-kinds`)."""
    from ragkit.config import load_settings
    from ragkit.session import Session
    from ragkit.tune.kinds import KindsOptions, tune_kinds
    from ragkit.tune.training import shown_path

    with command_errors(as_json):
        opts = KindsOptions(seed=seed, negatives=negatives, c=c)
        command = " ".join(["ragkit tune kinds", shlex.quote(shown_path(master)), "--out", shlex.quote(shown_path(out)),
                            *(a for h in hold_out or [] for a in ("--hold-out", shlex.quote(shown_path(h)))),
                            "--seed", str(seed), "--negatives", str(negatives), "--c", str(c)])
        card = tune_kinds(master, out, Session(load_settings()), opts, held_out=hold_out, command=command,
                          log=lambda m: err.print(m, highlight=False, markup=False))
        if as_json:
            print_json(card)
