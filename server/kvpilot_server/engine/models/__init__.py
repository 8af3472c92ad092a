"""The Llama-family model, its configuration, and how a rank loads and sets it up from a
Hugging Face checkpoint."""
