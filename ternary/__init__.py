"""vllm-ternary: ternary-weight (BitNet b1.58 style) kernels and their vLLM loader.

Importing the package is cheap and needs no torch (the build system imports ternary._build
before torch exists). The ops live in ternary.ops; importing it loads the compiled
extension where one is present.
"""

__version__ = "0.1.0"
