"""Models written from nothing, deterministically: tiny.py (small Llama and BitNetForCausalLM
checkpoints with a trained tokenizer, for tests and smoke) and bigmodel.py (real models'
shapes with random ternary weights, for benchmarks)."""
