"""Moved to `ragkit.embed.hash`; this name stays for scripts that import it, as the same
module object (so patching an attribute here patches the real one)."""

import sys

from ragkit.embed import hash as _hash

sys.modules[__name__] = _hash
