"""Timing this machine with the real engine: :mod:`.calibrate` runs small probe models through
llama-server and files what it measured for later estimates. I/O: processes and disk."""
