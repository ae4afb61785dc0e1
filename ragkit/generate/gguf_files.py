"""Checks on GGUF files before llama.cpp sees them, split models included.

A split model is `NAME-00001-of-0000N.gguf` ... `NAME-0000N-of-0000N.gguf` (the name
format of llama.cpp's `llama_split_path`). llama.cpp loads all shards when given the
first one, but a missing or truncated shard, or a path to another shard, gives only
"Failed to load model from file" — so ragkit checks the files itself and names the
culprit. Only headers are read (a few KB per shard), never weights.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ragkit.errors import ModelNotFound

GGUF_MAGIC = b"GGUF"
_SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class SplitName:
    prefix: str  # path prefix, without "-0000k-of-0000N.gguf"
    no: int  # 1-based
    count: int


def split_name(path: Path) -> SplitName | None:
    """The shard number and count encoded in a file name, or None for an unsplit name."""
    m = _SPLIT_RE.match(str(path))
    if not m:
        return None
    return SplitName(m["prefix"], int(m["no"]), int(m["count"]))


def shard_path(prefix: str, no: int, count: int) -> Path:
    return Path(f"{prefix}-{no:05d}-of-{count:05d}.gguf")


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _split_count_in_header(path: Path) -> int | None:
    """`split.count` from a GGUF header (None when absent)."""
    value = read_header(path).metadata.get("split.count")
    return int(value) if value is not None else None


def check_shards(path: Path) -> list[Path]:
    """Every file of the model at `path`, first shard first. Raises ModelNotFound naming
    the missing or non-GGUF shard, or when `path` is not the first shard."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFound(f"model file {path} does not exist")
    sn = split_name(path)
    if sn is None:
        if not _is_gguf(path):
            raise ModelNotFound(f"{path} is not a GGUF file (no GGUF magic)")
        count = _split_count_in_header(path)
        if count and count > 1:
            raise ModelNotFound(
                f"{path} is one shard of a {count}-part split model but its name lacks -0000k-of-0000N",
                hint="keep the original shard names and point at the -00001-of- file",
            )
        return [path]
    if sn.no != 1:
        first = shard_path(sn.prefix, 1, sn.count)
        raise ModelNotFound(
            f"{path.name} is shard {sn.no} of {sn.count}; llama.cpp loads a split model from its first shard",
            hint=f"use {first}",
        )
    shards = [shard_path(sn.prefix, k, sn.count) for k in range(1, sn.count + 1)]
    missing = [p for p in shards if not p.is_file()]
    if missing:
        names = ", ".join(p.name for p in missing)
        raise ModelNotFound(
            f"split model {path.name}: {len(missing)} of {sn.count} shards missing: {names} (looked in {path.parent})",
        )
    not_gguf = [p for p in shards if not _is_gguf(p)]
    if not_gguf:
        raise ModelNotFound(f"split model {path.name}: not a GGUF file: {', '.join(p.name for p in not_gguf)} (incomplete download?)")
    for k, p in enumerate(shards):
        header = read_header(p)  # raises ModelNotFound naming a truncated shard
        count = header.metadata.get("split.count")
        if count is not None and int(count) != sn.count:
            raise ModelNotFound(f"{p.name} says split.count = {count} in its header but {sn.count} in its name")
        no = header.metadata.get("split.no")
        if no is not None and int(no) != k:
            raise ModelNotFound(f"{p.name} is split.no {int(no) + 1} by its header, not {k + 1}: shards from different models?")
    return shards


# ---------------------------------------------------------------------- headers
#
# gguf.GGUFReader (Python) parses every vocabulary string through numpy memmap views:
# measured here it took 40 s for the header of a 491 MB Qwen GGUF (151K tokens + merges)
# on a busy 2-core machine, and Kimi K2's first shard has a vocabulary of the same size.
# So headers are read with ggml's own C GGUF reader (`gguf_init_from_file` in the
# libggml-base that llama-cpp-python bundles: the parser llama.cpp itself uses, which
# reads metadata and tensor infos without touching weights) through ctypes.

_GGUF_SCALAR = {  # enum gguf_type -> (getter, ctypes restype)
    0: ("gguf_get_val_u8", ctypes.c_uint8), 1: ("gguf_get_val_i8", ctypes.c_int8),
    2: ("gguf_get_val_u16", ctypes.c_uint16), 3: ("gguf_get_val_i16", ctypes.c_int16),
    4: ("gguf_get_val_u32", ctypes.c_uint32), 5: ("gguf_get_val_i32", ctypes.c_int32),
    6: ("gguf_get_val_f32", ctypes.c_float), 7: ("gguf_get_val_bool", ctypes.c_bool),
    8: ("gguf_get_val_str", ctypes.c_char_p), 10: ("gguf_get_val_u64", ctypes.c_uint64),
    11: ("gguf_get_val_i64", ctypes.c_int64), 12: ("gguf_get_val_f64", ctypes.c_double),
}
_GGUF_ARRAY = 9
_GGUF_STRING = 8


@dataclass(frozen=True)
class TensorHeader:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ggml order (ne0 first)
    nbytes: int
    offset: int  # from the start of the data section


@dataclass
class GGUFHeader:
    path: Path
    file_size: int
    data_offset: int
    metadata: dict[str, Any]  # scalars; numeric arrays as lists; string arrays as their length
    tensors: list[TensorHeader] = field(default_factory=list)

    @property
    def arch(self) -> str | None:
        return self.metadata.get("general.architecture")

    def key(self, suffix: str, default: Any = None) -> Any:
        """An architecture key such as `block_count` -> metadata["deepseek2.block_count"]."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)


def ggml_library(stem: str) -> ctypes.CDLL:
    """A ggml shared library bundled with llama-cpp-python (already loaded by libllama)."""
    import llama_cpp.llama_cpp as lc

    base = Path(getattr(lc, "_base_path", Path(lc.__file__).parent / "lib"))
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll", f"lib{stem}.dll"):
        if (base / name).exists():
            return ctypes.CDLL(str(base / name))
    raise ModelNotFound(f"{stem} library not found next to llama-cpp-python's libllama in {base}")


@lru_cache(maxsize=1)
def _gguf_lib() -> ctypes.CDLL:
    lib = ggml_library("ggml-base")

    class InitParams(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]

    lib._InitParams = InitParams  # type: ignore[attr-defined]
    c, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    sigs = {
        "gguf_init_from_file": ([ctypes.c_char_p, InitParams], c),
        "gguf_free": ([c], None),
        "gguf_get_data_offset": ([c], sz),
        "gguf_get_n_kv": ([c], i64),
        "gguf_get_key": ([c, i64], ctypes.c_char_p),
        "gguf_get_kv_type": ([c, i64], ctypes.c_int),
        "gguf_get_arr_type": ([c, i64], ctypes.c_int),
        "gguf_get_arr_n": ([c, i64], sz),
        "gguf_get_arr_data": ([c, i64], c),
        "gguf_get_n_tensors": ([c], i64),
        "gguf_get_tensor_name": ([c, i64], ctypes.c_char_p),
        "gguf_get_tensor_type": ([c, i64], ctypes.c_int),
        "gguf_get_tensor_size": ([c, i64], sz),
        "gguf_get_tensor_offset": ([c, i64], sz),
        "gguf_get_tensor_ne": ([c, i64], ctypes.POINTER(i64)),
    }
    for fn, (args, res) in sigs.items():
        f = getattr(lib, fn)
        f.argtypes, f.restype = args, res
    for fn, res in _GGUF_SCALAR.values():
        f = getattr(lib, fn)
        f.argtypes, f.restype = [c, i64], res
    return lib


_ARRAY_CTYPES = {0: ctypes.c_uint8, 1: ctypes.c_int8, 2: ctypes.c_uint16, 3: ctypes.c_int16, 4: ctypes.c_uint32,
                 5: ctypes.c_int32, 6: ctypes.c_float, 7: ctypes.c_bool, 10: ctypes.c_uint64, 11: ctypes.c_int64,
                 12: ctypes.c_double}


@lru_cache(maxsize=64)
def _read_header_cached(path: str, size: int, mtime_ns: int) -> GGUFHeader:
    lib = _gguf_lib()
    ctx = lib.gguf_init_from_file(path.encode(), lib._InitParams(True, None))
    if not ctx:
        raise ModelNotFound(f"{path} is not a readable GGUF file (bad or truncated header)")
    try:
        meta: dict[str, Any] = {}
        for k in range(lib.gguf_get_n_kv(ctx)):
            key = lib.gguf_get_key(ctx, k).decode("utf-8", "replace")
            t = lib.gguf_get_kv_type(ctx, k)
            if t == _GGUF_ARRAY:
                n = lib.gguf_get_arr_n(ctx, k)
                at = lib.gguf_get_arr_type(ctx, k)
                if at in _ARRAY_CTYPES and n <= 4096:
                    ptr = lib.gguf_get_arr_data(ctx, k)
                    meta[key] = list((_ARRAY_CTYPES[at] * n).from_address(ptr)) if n else []
                else:
                    meta[key] = n  # long or string arrays (vocabulary, merges): their length
            elif t in _GGUF_SCALAR:
                v = getattr(lib, _GGUF_SCALAR[t][0])(ctx, k)
                meta[key] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        tensors = []
        for j in range(lib.gguf_get_n_tensors(ctx)):
            ne = lib.gguf_get_tensor_ne(ctx, j)
            shape = [ne[d] for d in range(4)]
            while len(shape) > 1 and shape[-1] == 1:
                shape.pop()
            tensors.append(TensorHeader(
                name=lib.gguf_get_tensor_name(ctx, j).decode(),
                ggml_type=lib.gguf_get_tensor_type(ctx, j),
                shape=tuple(shape),
                nbytes=lib.gguf_get_tensor_size(ctx, j),
                offset=lib.gguf_get_tensor_offset(ctx, j),
            ))
        header = GGUFHeader(Path(path), size, lib.gguf_get_data_offset(ctx), meta, tensors)
    finally:
        lib.gguf_free(ctx)
    end = max((header.data_offset + t.offset + t.nbytes for t in tensors), default=header.data_offset)
    if size < end:
        raise ModelNotFound(f"{Path(path).name} is truncated: {size} bytes, its tensors end at {end} (incomplete download?)")
    return header


def read_header(path: Path) -> GGUFHeader:
    """Metadata and tensor infos of one GGUF file, weights untouched. ModelNotFound when it
    is not a GGUF or is shorter than its tensor table says."""
    path = Path(path)
    if not _is_gguf(path):
        raise ModelNotFound(f"{path} is not a GGUF file (no GGUF magic)")
    st = os.stat(path)
    return _read_header_cached(str(path), st.st_size, st.st_mtime_ns)
