"""Benchmarks: each module's ``run()`` measures and returns a markdown section for docs/benchmarks.md."""
