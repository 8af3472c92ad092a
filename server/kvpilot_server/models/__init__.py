"""Where model checkpoints come from: the bundled model, hf:// and local paths."""
