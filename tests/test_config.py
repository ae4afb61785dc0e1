from pathlib import Path

import pytest

from ragkit.config import load_settings
from ragkit.errors import ConfigError


def test_defaults_are_the_laptop_profile(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    s = load_settings()
    assert s.profile == "laptop"
    assert s.store == Path(".ragkit")
    assert s.generator.model == "qwen2.5-coder-0.5b"
    assert s.generator.chat_template is None  # the GGUF's own template


def test_toml_then_env_then_explicit(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ragkit.toml").write_text('store = "from-toml"\n[generator]\nn_ctx = 4096\nmax_tokens = 100\n')
    s = load_settings()
    assert s.store == Path("from-toml") and s.generator.n_ctx == 4096
    monkeypatch.setenv("RAGKIT_STORE", "from-env")
    monkeypatch.setenv("RAGKIT_GENERATOR__N_CTX", "8192")
    s = load_settings()
    assert s.store == Path("from-env") and s.generator.n_ctx == 8192 and s.generator.max_tokens == 100
    s = load_settings(store="explicit")
    assert s.store == Path("explicit")


def test_kimi_profile_fills_only_what_the_user_left_unset(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    s = load_settings(profile="kimi-k2")
    assert s.generator.chat_template == "kimi-k2"
    assert s.generator.n_ctx == 16384 and s.generator.temperature == 0.6 and s.generator.min_p == 0.01
    # a strong model reads the whole document for checklist labels (one cached prefix);
    # the laptop default decides them on the quoted clause
    assert s.compare.label_context == "document" and load_settings().compare.label_context == "clause"
    monkeypatch.setenv("RAGKIT_GENERATOR__N_CTX", "32768")
    s = load_settings(profile="kimi-k2")
    assert s.generator.n_ctx == 32768 and s.generator.temperature == 0.6


def test_bad_settings_are_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="unknown profile"):
        load_settings(profile="nope")
    monkeypatch.setenv("RAGKIT_GENERATOR__N_CTX", "lots")
    with pytest.raises(ConfigError, match="generator.n_ctx"):
        load_settings()
