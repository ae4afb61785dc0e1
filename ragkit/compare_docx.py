"""`ragkit.compare_docx` moved to `ragkit.compare.docx`; this name stays for scripts that
import it, as the same module object."""

import sys
from importlib import import_module

sys.modules[__name__] = import_module("ragkit.compare.docx")
