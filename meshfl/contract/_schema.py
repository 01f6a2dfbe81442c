"""How the contract's ``TypedDict`` shapes validate under pydantic, without pydantic.

pydantic (the coordinator's FastAPI) reads a ``TypedDict``'s ``__pydantic_config__``;
setting it as a plain dict keeps the contract free of pydantic. Every shape of the
contract carries one of the two class decorators below, written on its definition:

- :func:`strict`: ``true`` is not 1, ``"8"`` is not 8 (integers are still accepted where a
  float is expected); unknown keys are dropped. Responses, and ``CapabilityProfile``
  (unknown measurements are dropped, so a newer agent still enrols).
- :func:`strict_request`: strict as well, and unknown keys are refused
  (``extra="forbid"``: 422, and ``additionalProperties: false`` in the OpenAPI): request
  bodies and their parts, so a misspelt option (``dp_noise_multipler``) is a 422, not
  silently ignored.

A subclass (``LedgerRow(LedgerCounts)``) does not inherit the setting from its base at
runtime, so it carries its own decorator.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["strict", "strict_request"]

_Shape = TypeVar("_Shape", bound=type)


def strict(shape: _Shape) -> _Shape:
    """Mark ``shape`` strict for pydantic (no type coercion; unknown keys dropped).

    Parameters
    ----------
    shape : type
        A ``TypedDict`` class.

    Returns
    -------
    type
        ``shape`` itself, with ``__pydantic_config__ = {"strict": True}``.

    """
    shape.__pydantic_config__ = {"strict": True}  # type: ignore[attr-defined]
    return shape


def strict_request(shape: _Shape) -> _Shape:
    """Mark ``shape`` a strict request body for pydantic: unknown keys are refused (422).

    Parameters
    ----------
    shape : type
        A ``TypedDict`` class.

    Returns
    -------
    type
        ``shape`` itself, with ``__pydantic_config__ = {"strict": True, "extra": "forbid"}``.

    """
    shape.__pydantic_config__ = {"strict": True, "extra": "forbid"}  # type: ignore[attr-defined]
    return shape
