"""The inference engine: a paged-KV-cache runtime serving a Llama-family model on PyTorch.

runtime/ admits requests, schedules and runs steps and turns logits into text; models/ builds
the model from a checkpoint; layers/ are its building blocks and KV cache; kernels/ the optional
compiled CPU kernels; distributed/ tensor parallelism across processes; huge_pages.py puts the
host's weights and KV cache on 2 MiB pages.
"""
