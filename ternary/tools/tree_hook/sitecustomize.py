"""Put first on PYTHONPATH by ternary.tools.supervise for a supervised process tree: every
Python process of the tree arms PR_SET_PDEATHSIG(SIGKILL) at interpreter start, so none
outlives a supervisor killed with SIGKILL (see supervise.guard_process). Then the next
sitecustomize on the path runs as it would have (bench-serve's stack dumper, a venv's own)."""

import importlib.util
import os
import sys

try:
    from ternary.tools.supervise import guard_process
except ImportError:  # ternary not importable in this interpreter: nothing to guard with
    pass
else:
    guard_process()

_here = os.path.dirname(os.path.abspath(__file__))
for _d in sys.path:
    _next = os.path.join(_d or os.getcwd(), "sitecustomize.py")
    if os.path.abspath(_d or os.getcwd()) != _here and os.path.isfile(_next):
        _spec = importlib.util.spec_from_file_location("_next_sitecustomize", _next)
        _mod = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
        break
