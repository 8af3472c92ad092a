"""Where model checkpoints come from: the bundled model, local paths, tiny test checkpoints."""
