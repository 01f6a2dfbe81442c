"""Describe the machine a benchmark ran on: the one implementation is meshfl.app.bench.machine.

The benchmark scripts put this folder on ``sys.path`` and ``from machine import
describe``; benchmark code lives in :mod:`meshfl.app.bench`, this folder holds entry scripts.
"""

from __future__ import annotations

from meshfl.app.bench.machine import describe

__all__ = ["describe"]
