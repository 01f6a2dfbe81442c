"""The meshfl coordinator: the fleet's REST control plane (FastAPI + SQLAlchemy).

Build the app with :func:`create_app` from a :class:`CoordinatorSettings`, or run it
with :func:`serve`. The coordinator never imports torch, paho or the other apps.
"""

from coordinator.app import create_app
from coordinator.server import serve
from coordinator.settings import CoordinatorSettings

__all__ = ["CoordinatorSettings", "create_app", "serve"]
