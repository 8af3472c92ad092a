"""The model's building blocks: paged attention and its KV cache, dense and quantized linear
layers, the int8 lm_head and bfloat16 matrices on CPU."""
