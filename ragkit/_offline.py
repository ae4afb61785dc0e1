"""Offline by construction.

Every phone-home switch of every library ragkit loads is set here, before any of
those libraries is imported: huggingface_hub / transformers / sentence-transformers,
chromadb and the onnxruntime it pulls in, tokenizers. A switch belongs here only if
a library ragkit loads reads it. `ragkit/__init__.py` imports this module first, so a
user never has to set anything.
"""

from __future__ import annotations

import os

# Values are forced (not setdefault): a user's environment must not be able to
# re-enable a hub download or telemetry by accident.
OFFLINE_ENV = {
    # huggingface_hub (under sentence-transformers and transformers): never reach the hub
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",  # transformers (read through huggingface_hub)
    "HF_DATASETS_OFFLINE": "1",  # datasets (under `ragkit tune`'s CrossEncoderTrainer)
    "HF_HUB_DISABLE_TELEMETRY": "1",  # huggingface_hub and transformers
    "DO_NOT_TRACK": "1",  # huggingface_hub reads it as HF_HUB_DISABLE_TELEMETRY too
    "ORT_DISABLE_TELEMETRY": "1",  # onnxruntime (pulled in by chromadb): read by its native core
    "ANONYMIZED_TELEMETRY": "False",  # chromadb's product telemetry (posthog)
    "CHROMA_TELEMETRY_IMPL": "none",  # chromadb
    "TOKENIZERS_PARALLELISM": "false",  # tokenizers: no fork warning, no extra threads
}


def apply() -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ[key] = value


apply()
