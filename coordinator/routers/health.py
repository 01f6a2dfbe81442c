"""Liveness probe (no auth), for Docker health checks and ``meshfl local``."""

from __future__ import annotations

from fastapi import APIRouter

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Return ``{"status": "ok"}`` while the process serves requests."""
    return {"status": "ok"}
