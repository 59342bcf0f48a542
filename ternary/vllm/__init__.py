"""The vLLM side of ternary: a quantization method that serves ternary checkpoints.

- spec.py      what a checkpoint's `quantization_config` says (no vLLM import, testable anywhere)
- config.py    TernaryConfig, the vLLM QuantizationConfig (quant_method "ternary"; also claims
               `bitnet` checkpoints of Llama-architecture models)
- linear.py    TernaryLinearMethod: allocate in the checkpoint layout, let vLLM's own loaders
               shard, repack after loading, run the kernel in forward
- register.py  version-adaptive registration (vLLM 0.6.x ... 0.33)

Nothing here is imported by `import ternary`: vLLM is optional.
"""
