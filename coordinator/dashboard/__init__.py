"""The coordinator's web dashboard at ``/ui``: fleet, topology graph, training curves.

A read-only page served by the coordinator itself (no build step, no CDN): log in with
an API token, then the page follows the fleet and a job live over server-sent events.
docs/dashboard.md describes it; :func:`install` mounts it on an app.
"""

from coordinator.dashboard.router import install

__all__ = ["install"]
