"""One settings model: defaults < profile < ragkit.toml < RAGKIT_* environment < explicit overrides.

`ragkit.toml` is read from the current directory (or the file named by RAGKIT_CONFIG).
Nested fields use `__` in the environment: `RAGKIT_GENERATOR__N_CTX=8192`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ragkit.errors import ConfigError


class EmbedSettings(BaseModel):
    model: str = Field("minilm", description="registry name (minilm) or a path to a sentence-transformers model")
    batch_size: int = 32
    device: str = "cpu"


class IngestSettings(BaseModel):
    pdf_engine: Literal["pypdfium2", "pypdf"] = "pypdfium2"
    chunk_tokens: int = Field(0, description="max embedder tokens per chunk; 0 = the embedder's own limit")
    min_chunk_tokens: int = 40

    @field_validator("chunk_tokens")
    @classmethod
    def _chunk_room(cls, v: int) -> int:
        if v != 0 and v < 8:
            raise ValueError("must be 0 (the embedder's own limit) or at least 8 tokens")
        return v
    max_file_mb: int = 200
    max_pages: int = 3000
    max_docx_inflated_mb: int = 300
    ocr_lang: str = Field("eng", description="tesseract language(s) for scanned PDFs: eng, chi_sim, eng+chi_sim")
    tables: bool = Field(True, description="detect tables in PDFs and keep them whole as Markdown")


class RetrieveSettings(BaseModel):
    mode: Literal["hybrid", "dense", "bm25"] = "hybrid"
    top_k: int = 8
    candidates: int = 40
    rrf_k: int = 60
    # 0.5 measured best of {0 (dense only), 0.5, 1.0} on the SEC 10-Q and ContractNLI sets
    bm25_weight: float = Field(0.5, description="weight of the BM25 ranking in the fusion (dense has 1.0)")
    reranker: str | None = Field(None, description="path to a sentence-transformers CrossEncoder; off by default")
    rerank_candidates: int = 30
    abstain_below: float = Field(
        0.30,
        description="answer 'The documents do not say.' without generating when the best source's cosine "
        "similarity to the question is below this (0 turns the gate off)",
    )


class GeneratorSettings(BaseModel):
    backend: Literal["llama_cpp", "openai"] = "llama_cpp"
    model: str = Field("qwen2.5-coder-0.5b", description="registry name or a path to a GGUF (first shard of a split)")
    chat_template: str | None = Field(
        None, description="template file in prompts/chat (e.g. kimi-k2) or a path; None = the GGUF's own"
    )
    n_ctx: int = 3072
    max_tokens: int = 320
    temperature: float = 0.1
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.05
    seed: int = 42
    n_threads: int = Field(0, description="0 = pick from the free cores")
    n_gpu_layers: int = 0
    n_batch: int = 512
    n_ubatch: int = 512
    use_mmap: bool = True
    use_mlock: bool = False
    verbose: bool = False
    # llama.cpp tensor buffer-type overrides, "PATTERN=BUFFER" (e.g. ".ffn_.*_exps.=CPU")
    tensor_overrides: list[str] = Field(default_factory=list)
    type_k: Literal["f16", "q8_0", "q4_0"] | None = None
    type_v: Literal["f16", "q8_0", "q4_0"] | None = None
    flash_attn: bool = False
    # OpenAI-compatible engine (llama-server, vLLM, SGLang) when backend = "openai"
    base_url: str | None = None
    api_key: str | None = None
    remote_model: str | None = Field(None, description="model name to send to the engine")
    timeout_s: float = 600.0
    retries: int = 3
    # projected prefill rate for cost reports (published llama.cpp hybrid Kimi K2 figure)
    prompt_rate_tok_s: float = 106.0


class CompareSettings(BaseModel):
    # What a Yes/No checklist label is decided on. "clause": the quoted clause alone (a
    # ~100-token prompt; measured better for the small laptop models, which lose the
    # thread in a whole contract: ContractNLI accuracy 0.15 whole-document vs 0.47 on the
    # clause, Qwen2.5-Coder-0.5B, 34 items). "document": the whole document or its
    # retrieved sections, one cached prefix for every item (for a strong model).
    label_context: Literal["clause", "document"] = "clause"
    # divide the label probabilities by the model's prior for the item (scored on an empty clause)
    calibrate: bool = True


class ServeSettings(BaseModel):
    """`ragkit serve`: the OpenAI-compatible HTTP server."""

    host: str = Field("127.0.0.1", description="address to bind; anything but loopback needs a token")
    port: int = Field(8000, ge=0, le=65535)
    token: SecretStr | None = Field(None, description="bearer token every route but GET /health requires (RAGKIT_SERVE__TOKEN)")
    max_queue: int = Field(4, ge=0, description="requests that may wait for the generator; more get 429")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="largest request body on /v1/ routes (413 above)")
    max_upload_mb: int = Field(50, ge=1, description="largest upload (MB); other routes than /v1/ take this much plus 1 MB")
    history_tokens: int = Field(
        256, ge=0, description="prompt tokens set aside for earlier chat turns, so follow-ups pack the same sources"
    )


# Profiles set generator defaults for a kind of machine. Values the user sets in
# ragkit.toml or the environment win over the profile.
PROFILES: dict[str, dict[str, Any]] = {
    "laptop": {},
    "kimi-k2": {
        "generator": {
            "chat_template": "kimi-k2",
            "n_ctx": 16384,
            "max_tokens": 1024,
            "temperature": 0.6,
            "min_p": 0.01,
            "top_p": 1.0,
            "repeat_penalty": 1.0,
            "n_gpu_layers": 99,
            "n_batch": 4096,
            "n_ubatch": 4096,
            "use_mmap": False,
            "tensor_overrides": [".ffn_.*_exps.=CPU"],
            "flash_attn": True,
        },
        "compare": {"label_context": "document"},
    },
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RAGKIT_",
        env_nested_delimiter="__",
        extra="forbid",
        toml_file="ragkit.toml",
    )

    profile: str = "laptop"
    store: Path = Path(".ragkit")
    store_url: str | None = Field(None, description="Chroma server URL (http://host:port); None = embedded")
    collection: str = "ragkit"
    cache_dir: Path = Field(default_factory=lambda: Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ragkit")
    embed: EmbedSettings = EmbedSettings()
    ingest: IngestSettings = IngestSettings()
    retrieve: RetrieveSettings = RetrieveSettings()
    generator: GeneratorSettings = GeneratorSettings()
    compare: CompareSettings = CompareSettings()
    serve: ServeSettings = ServeSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = os.environ.get("RAGKIT_CONFIG", "ragkit.toml")
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=toml_path))


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _explicit(model: BaseModel) -> dict[str, Any]:
    """The fields a source actually set (recursively), so a profile only fills the rest."""
    out: dict[str, Any] = {}
    for name in model.model_fields_set:
        value = getattr(model, name)
        out[name] = _explicit(value) if isinstance(value, BaseModel) else value
    return out


def load_settings(**overrides: Any) -> Settings:
    """Load settings from every source, then apply the chosen profile under them."""
    try:
        raw = Settings(**overrides)
        profile = raw.profile
        if profile not in PROFILES:
            raise ConfigError(f"unknown profile {profile!r}", hint=f"choose one of {', '.join(PROFILES)}")
        merged = _deep_merge(PROFILES[profile], _explicit(raw))
        return Settings.model_validate(merged) if merged else Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"invalid setting {where}: {first['msg']}") from None
