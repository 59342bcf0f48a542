"""Build-system helpers: read the target matrix, find a pinned CUDA toolchain, check it,
inspect what was built. Imports with the standard library alone, because building starts
before torch exists (the noxfile and setup.py import this package)."""
