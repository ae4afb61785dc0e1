"""Moved to `ragkit.embed.onnx`; this name stays for scripts that import it, as the same
module object (so patching an attribute here patches the real one)."""

import sys

from ragkit.embed import onnx as _onnx

sys.modules[__name__] = _onnx
