"""The engines tierlocal drives: llama-server's command line built once from a plan
(:mod:`.flags`), Ollama's settings (:mod:`.ollama`), the binary itself (:mod:`.llama_server`:
finding it, its devices and options), building it (:mod:`.build`), its load log
(:mod:`.loadlog`), and running one as a supervised child (:mod:`.process`, with the watchdog
:mod:`.watchdog` that outlives tierlocal)."""
