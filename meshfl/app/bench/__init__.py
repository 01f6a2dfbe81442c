"""Benchmarks behind ``meshfl bench`` (composition root: may import every package)."""
