"""Getting models onto this machine: Hugging Face files (resumable, verified, in the hub's
cache layout), Ollama tags through an Ollama server, and GGUF headers read where they lie
(:mod:`.sources`: a path, HTTP Range requests, ``hf://``). I/O: network and disk. Which file a
catalog name means is :mod:`tierlocal.resolve`'s (it asks the recommendation, above this)."""
