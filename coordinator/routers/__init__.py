"""One router per resource: devices, jobs, health."""

from coordinator.routers import devices, health, jobs

__all__ = ["devices", "health", "jobs"]
