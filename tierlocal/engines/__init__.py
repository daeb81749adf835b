"""Inference engines tierlocal runs or queries: llama-server (and, later, Ollama)."""
