"""Getting models onto this machine: Hugging Face files (resumable, verified, in the hub's
cache layout), Ollama tags through an Ollama server, and the one resolver that turns a SOURCE or
a catalog name into a local file. I/O: network and disk."""
