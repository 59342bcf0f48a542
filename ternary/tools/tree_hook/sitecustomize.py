"""Put first on PYTHONPATH by ternary.tools.supervise for a supervised process tree: every
Python process of the tree arms PR_SET_PDEATHSIG(SIGKILL) at interpreter start, so none
outlives a supervisor killed with SIGKILL (see supervise.guard_process)."""

try:
    from ternary.tools.supervise import guard_process
except ImportError:  # ternary not importable in this interpreter: nothing to guard with
    pass
else:
    guard_process()
