"""Helpers the tests and benches share: the prepared assets, the CLI as a user runs it, real
engines and servers on loopback, a fault-injecting proxy, and GGUF writers (tiny real files and
sparse files of real architectures). Import as ``tests.support.NAME`` from the repository root
(``python -m pytest``, ``python -m bench.NAME``)."""
