"""`ragkit.chat` moved to `ragkit.answer.chat` (checking an answer is not retrieval); this name
stays for scripts that import it, as the same module object."""

import sys
from importlib import import_module

sys.modules[__name__] = import_module("ragkit.answer.chat")
