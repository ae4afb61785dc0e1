"""The lexical index moved to `ragkit.store.lexical` (the store owns everything on disk);
this name stays for scripts that import it, as the same module object."""

import sys

from ragkit.store import lexical as _lexical

sys.modules[__name__] = _lexical
