"""llama.cpp settings that `llama_cpp.Llama()` has no argument for, and llama.cpp's log.

Tensor buffer-type overrides (llama.cpp `-ot PATTERN=BUFTYPE`, e.g. `.ffn_.*_exps.=CPU`
keeps Kimi K2's routed experts in host RAM while everything else goes to the GPU) live in
`llama_model_params.tensor_buft_overrides`: a NULL-terminated array of
`{const char *pattern; ggml_backend_buffer_type_t buft}`. llama-cpp-python 0.3.36 declares
the field as a bare pointer and never sets it, so ragkit builds the array with ctypes and
hands it over by wrapping `llama_cpp.llama_model_default_params` (which `Llama.__init__`
calls by module attribute) for the duration of one load, under a lock. The array and the
pattern bytes are kept alive on the generator for as long as the model lives.

Buffer types are looked up by name the way llama.cpp's own `-ot` parser does
(common/arg.cpp `parse_tensor_buffer_overrides`): each registered ggml device's buffer type,
keyed by `ggml_backend_buft_name` ("CPU", "CUDA0", ...).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import threading
from dataclasses import dataclass, field
from typing import Iterator

from ragkit.config import GeneratorSettings
from ragkit.errors import ConfigError

_LOAD_LOCK = threading.RLock()


# ---------------------------------------------------------------------- parsing

def parse_overrides(specs: list[str]) -> list[tuple[str, str]]:
    """"PATTERN=BUFTYPE" strings -> [(pattern, buftype)]. ConfigError on a malformed one."""
    out = []
    for spec in specs:
        pattern, sep, buft = spec.rpartition("=")
        if not sep or not pattern or not buft.strip():
            raise ConfigError(
                f"invalid tensor override {spec!r} in generator.tensor_overrides",
                hint='use "PATTERN=BUFFER", e.g. ".ffn_.*_exps.=CPU"',
            )
        try:  # llama.cpp compiles it with std::regex (ECMAScript); Python's re is close enough to catch typos
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"invalid regular expression {pattern!r} in generator.tensor_overrides: {exc}") from None
        out.append((pattern, buft.strip()))
    return out


def matches(pattern: str, tensor_name: str) -> bool:
    """Whether llama.cpp applies an override pattern to a tensor (it uses std::regex_search)."""
    return re.search(pattern, tensor_name) is not None


# ---------------------------------------------------------------------- buffer types

def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    from ragkit.generate.gguf_files import ggml_library

    base, reg = ggml_library("ggml-base"), ggml_library("ggml")
    vp = ctypes.c_void_p
    base.ggml_backend_cpu_buffer_type.argtypes, base.ggml_backend_cpu_buffer_type.restype = [], vp
    base.ggml_backend_dev_buffer_type.argtypes, base.ggml_backend_dev_buffer_type.restype = [vp], vp
    base.ggml_backend_buft_name.argtypes, base.ggml_backend_buft_name.restype = [vp], ctypes.c_char_p
    reg.ggml_backend_dev_count.argtypes, reg.ggml_backend_dev_count.restype = [], ctypes.c_size_t
    reg.ggml_backend_dev_get.argtypes, reg.ggml_backend_dev_get.restype = [ctypes.c_size_t], vp
    return base, reg


def buffer_types() -> dict[str, int]:
    """Name -> ggml_backend_buffer_type_t of every device llama.cpp can use here."""
    import llama_cpp  # noqa: F401  (loads libllama, which registers the backends)

    base, reg = _ggml()
    out: dict[str, int] = {"CPU": base.ggml_backend_cpu_buffer_type()}
    for i in range(reg.ggml_backend_dev_count()):
        buft = base.ggml_backend_dev_buffer_type(reg.ggml_backend_dev_get(i))
        if buft:
            out.setdefault(base.ggml_backend_buft_name(buft).decode(), buft)
    return out


@dataclass
class TensorOverrides:
    """A NULL-terminated llama_model_tensor_buft_override array and the memory it points to."""

    specs: list[tuple[str, str]]
    array: ctypes.Array | None = None
    _keep: list = field(default_factory=list)

    @classmethod
    def build(cls, specs: list[str]) -> "TensorOverrides":
        parsed = parse_overrides(specs)
        ov = cls(parsed)
        if not parsed:
            return ov
        available = buffer_types()
        by_upper = {k.upper(): v for k, v in available.items()}

        class Override(ctypes.Structure):
            _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

        arr = (Override * (len(parsed) + 1))()
        for i, (pattern, name) in enumerate(parsed):
            buft = by_upper.get(name.upper())
            if buft is None:
                raise ConfigError(
                    f"unknown buffer type {name!r} in generator.tensor_overrides",
                    hint=f"available here: {', '.join(sorted(available))}",
                )
            pb = ctypes.create_string_buffer(pattern.encode())
            ov._keep.append(pb)
            arr[i].pattern = ctypes.cast(pb, ctypes.c_char_p)
            arr[i].buft = buft
        arr[len(parsed)].pattern = None  # terminator
        arr[len(parsed)].buft = None
        ov.array = arr
        return ov

    @property
    def address(self) -> int | None:
        return ctypes.addressof(self.array) if self.array is not None else None


@contextlib.contextmanager
def model_params_patch(overrides: TensorOverrides | None) -> Iterator[None]:
    """Make `llama_cpp.llama_model_default_params()` return params with the override array
    set, for one `Llama(...)` call. Holds a lock so concurrent loads don't see each other's."""
    import llama_cpp.llama_cpp as lc

    with _LOAD_LOCK:
        if overrides is None or overrides.array is None:
            yield
            return
        original = lc.llama_model_default_params

        def with_overrides():
            params = original()
            params.tensor_buft_overrides = overrides.address
            return params

        lc.llama_model_default_params = with_overrides
        try:
            yield
        finally:
            lc.llama_model_default_params = original


# ---------------------------------------------------------------------- KV cache types

GGML_TYPES = {"f16": 1, "q4_0": 2, "q8_0": 8}  # enum ggml_type ids (ggml.h; llama_cpp.GGML_TYPE_*)


_BLOCK = {"f16": 1, "q8_0": 32, "q4_0": 32}


def cache_kwargs(cfg: GeneratorSettings, *, is_mla: bool, key_length: int | None = None, value_length: int | None = None) -> dict:
    """type_k / type_v / flash_attn for `Llama()`, checked against llama.cpp's rules
    (llama-context.cpp): a quantized V cache needs flash attention, and MLA models
    (deepseek2: one latent cache) need type_k == type_v."""
    k = cfg.type_k or "f16"
    v = cfg.type_v or (cfg.type_k if is_mla else None) or "f16"
    if is_mla and k != v:
        raise ConfigError(
            f"this model (MLA attention) needs the same K and V cache types, got type_k={k} type_v={v}",
            hint=f"set generator.type_v = {k!r}",
        )
    if v != "f16" and not cfg.flash_attn:
        raise ConfigError(f"a {v} V cache requires flash attention", hint="set generator.flash_attn = true")
    for what, t, n in (("K", k, key_length), ("V", v, value_length)):
        if n and int(n) % _BLOCK[t]:  # llama.cpp refuses it with only "Failed to create llama_context"
            raise ConfigError(
                f"a {t} {what} cache needs a head size divisible by {_BLOCK[t]}; this model's is {int(n)}",
                hint="set generator.type_k and type_v to f16",
            )
    out: dict = {"flash_attn": cfg.flash_attn}
    if cfg.type_k or (is_mla and cfg.type_v):
        out["type_k"] = GGML_TYPES[k]
    if cfg.type_v or (is_mla and cfg.type_k):
        out["type_v"] = GGML_TYPES[v]
    return out


# ---------------------------------------------------------------------- llama.cpp log

_LOG_LOCK = threading.RLock()
_LOG_STACK: list = []  # callbacks installed by capture_llama_log, innermost last


@contextlib.contextmanager
def capture_llama_log(forward: bool = True) -> Iterator[list[tuple[int, str]]]:
    """Collect llama.cpp's log lines [(ggml level, text)] while the block runs, every level
    (DEBUG included) whatever `verbose` says. Nests: an inner capture passes lines on to the
    outer one. With `forward`, the outermost passes them to llama-cpp-python's own handler
    (which prints them when verbose)."""
    import llama_cpp
    import llama_cpp._logger as ll

    lines: list[tuple[int, str]] = []

    with _LOG_LOCK:
        outer = _LOG_STACK[-1] if _LOG_STACK else (ll.llama_log_callback if forward else None)

        @llama_cpp.llama_log_callback
        def on_log(level: int, text: bytes, user_data) -> None:
            try:
                lines.append((level, text.decode("utf-8", "replace")))
            except Exception:
                pass
            if outer is not None:
                outer(level, text, user_data)

        _LOG_STACK.append(on_log)
        llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
        try:
            yield lines
        finally:
            _LOG_STACK.pop()
            llama_cpp.llama_log_set(_LOG_STACK[-1] if _LOG_STACK else ll.llama_log_callback, ctypes.c_void_p(0))


_OVERRIDDEN = re.compile(r"tensor (\S+) \((\d+) MiB (\S+)\) buffer type overridden to (\S+)")


def overridden_tensors(log: list[tuple[int, str]]) -> dict[str, str]:
    """{tensor name: buffer type} from llama.cpp's "buffer type overridden" log lines."""
    text = "".join(t for _, t in log)
    return {m.group(1): m.group(4) for m in _OVERRIDDEN.finditer(text)}
