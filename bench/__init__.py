"""Benchmarks for Istos. See ``bench/README.md``; the engine suite is ``python -m bench.engine``."""
