"""The one-machine fleet launcher behind ``meshfl local`` (part of the composition root)."""

from meshfl.app.local.run import LocalConfig, LocalRun, run_local

__all__ = ["LocalConfig", "LocalRun", "run_local"]
