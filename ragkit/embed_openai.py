"""Moved to `ragkit.embed.openai`; this name stays for scripts that import it, as the same
module object (so patching an attribute here patches the real one)."""

import sys

from ragkit.embed import openai as _openai

sys.modules[__name__] = _openai
