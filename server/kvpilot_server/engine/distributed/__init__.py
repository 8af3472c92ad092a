"""Tensor parallelism: the process group, how the model is sharded over it, rank 0's worker
processes and a worker's own main."""
