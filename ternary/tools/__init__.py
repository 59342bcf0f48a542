"""What runs on top of the package and the vLLM plugin: the checks and benchmarks the
`ternary` command exposes.

- engine.py       what the tools that start vLLM engines share (ports, processes, CPU backend)
- validate.py     vLLM against transformers' own implementation, token by token
- tp_compare.py   one checkpoint at two tensor-parallel sizes
- smoke.py        real OpenAI servers on tiny models, queried over HTTP
- bench_serve.py  serving tokens/s, TTFT, weight memory against bf16
- gemm_bench.py   the kernel table against cuBLAS and gemlite
- tp_kernels.py, kernel_soak.py   multi-GPU and long-run checks of the fused kernel
- doctor.py       what this machine can build and run
- synthetic/      models written from nothing: tiny ones for tests, real shapes for benchmarks
"""
