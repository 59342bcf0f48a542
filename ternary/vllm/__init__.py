"""The vLLM side of ternary: a quantization method that serves ternary checkpoints.

- plugin.py    the `vllm.general_plugins` entry point vLLM calls in every process
- spec.py      what a checkpoint's `quantization_config` says (no vLLM import, testable anywhere)
- config.py    TernaryConfig, the vLLM QuantizationConfig (quant_method "ternary"; also claims
               `bitnet` checkpoints of Llama-architecture models and BitNetForCausalLM)
- loading.py   checkpoint tensors -> the layout the linear method allocates, one shard a call
- linear.py    TernaryLinearMethod: allocate in the checkpoint layout, let vLLM's own loaders
               shard, repack after loading, run the kernel in forward (int8 activations where
               the checkpoint says so)
- models/      BitNetForCausalLM (microsoft/bitnet-b1.58-2B-4T's architecture)
- register.py  version-adaptive registration (vLLM 0.6.x ... 0.33)

Nothing here is imported by `import ternary`: vLLM is optional.
"""

# Starts the line ternary.vllm.linear logs for each layer shape; ternary.tools.smoke reads it
# from server logs (here: importing the package needs no vLLM).
KERNEL_LOG_PREFIX = "ternary kernel: "
