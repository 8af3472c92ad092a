"""kvpilot's Kubernetes operator (kopf). Never imports torch or transformers."""
