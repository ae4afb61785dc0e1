"""Offline by construction.

Every phone-home switch of every library ragkit loads is set here, before any of
those libraries is imported. `ragkit/__init__.py` imports this module first, so a
user never has to set anything.
"""

from __future__ import annotations

import os

# Values are forced (not setdefault): a user's environment must not be able to
# re-enable a hub download or telemetry by accident.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",  # huggingface_hub: never reach the hub
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",  # unstructured and others
    "SCARF_NO_ANALYTICS": "1",  # unstructured pings scarf on import otherwise
    "ORT_DISABLE_TELEMETRY": "1",  # onnxruntime (pulled in by chromadb)
    "ANONYMIZED_TELEMETRY": "False",  # chromadb
    "CHROMA_TELEMETRY_IMPL": "none",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply() -> None:
    for key, value in OFFLINE_ENV.items():
        os.environ[key] = value


apply()
