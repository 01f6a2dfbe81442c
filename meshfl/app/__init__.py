"""The composition root, above every app: the CLI, ``meshfl local`` and its lab, benchmarks.

Nothing below imports this package (import-linter's layers contract in pyproject.toml):
the kernel (:mod:`meshfl` minus this package) is numpy + stdlib only, the apps
(``edge_agent``, ``coordinator``, ``broker``, ``models``) meet through it, and only
``meshfl.app`` wires them together.
"""
