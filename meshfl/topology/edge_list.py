"""A custom topology from a JSON edge list (``{"n": N, "edges": [[i, j], ...]}``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshfl.errors import ConfigError
from meshfl.topology.graph import Graph, _edge, _reachable_from_0

__all__ = ["MAX_CUSTOM_NODES", "from_edge_list"]


_EDGE_LIST_KEYS = ("n", "edges")


MAX_CUSTOM_NODES = 100_000
"""Most nodes of a custom graph: bounds the memory a submitted edge list can claim."""


def from_edge_list(source: str | os.PathLike[str] | Mapping[str, Any]) -> Graph:
    """Build a custom graph from a JSON edge list.

    The document is ``{"n": N, "edges": [[i, j], ...]}``: ``N >= 1`` nodes numbered
    ``0 .. N−1`` and undirected edges given once each, in either orientation.

    Parameters
    ----------
    source : str, os.PathLike or Mapping
        A path to a ``.json`` file; or JSON text (a string starting with ``{``); or the
        already-parsed document.

    Returns
    -------
    Graph
        Simple and connected.

    Raises
    ------
    ConfigError
        If the file cannot be read or is not JSON, keys are missing or unknown, ``n`` is
        not an integer in ``[1, MAX_CUSTOM_NODES]``, an edge is not a pair of node indices
        in ``[0, n)``, is a self loop or a duplicate, or the graph is disconnected. The
        message names the file and the offending entry.

    """
    label, document = _load_edge_list(source)
    if not isinstance(document, Mapping):
        raise ConfigError(f'{label} must be a JSON object {{"n": N, "edges": [[i, j], ...]}}')
    missing = [key for key in _EDGE_LIST_KEYS if key not in document]
    unknown = sorted(str(key) for key in document if key not in _EDGE_LIST_KEYS)
    if missing or unknown:
        raise ConfigError(
            f'{label} must have exactly the keys "n" and "edges"'
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    n = document["n"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CUSTOM_NODES:
        raise ConfigError(
            f'{label}: "n" must be an integer in [1, {MAX_CUSTOM_NODES}], got {str(n)[:40]}'
        )
    raw_edges = document["edges"]
    if not isinstance(raw_edges, list):
        raise ConfigError(f'{label}: "edges" must be a list of [i, j] pairs')
    first_seen: dict[tuple[int, int], int] = {}
    for index, item in enumerate(raw_edges):
        where = f"{label}: edges[{index}] = {json.dumps(item)}"
        if not (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise ConfigError(f"{where} is not a pair of node indices [i, j]")
        i, j = item
        if not (0 <= i < n and 0 <= j < n):
            raise ConfigError(f"{where} names a node outside 0 .. {n - 1} (n = {n})")
        if i == j:
            raise ConfigError(f"{where} is a self loop; a node always mixes with itself")
        edge = _edge(i, j)
        if edge in first_seen:
            raise ConfigError(f"{where} repeats edges[{first_seen[edge]}]; list each edge once")
        first_seen[edge] = index
    graph = Graph(n, frozenset(first_seen))
    if not graph.is_connected():
        reached = _reachable_from_0(graph)
        cut = [i for i in range(n) if i not in reached]
        shown = ", ".join(map(str, cut[:10])) + (", …" if len(cut) > 10 else "")
        raise ConfigError(
            f"{label}: the graph is disconnected; node(s) {shown} cannot be reached from "
            "node 0, so gossip cannot reach consensus"
        )
    return graph


def _load_edge_list(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[str, Any]:
    """Return a label for error messages and the parsed JSON document."""
    if isinstance(source, Mapping):
        return "custom topology", source
    if isinstance(source, str) and source.lstrip().startswith("{"):
        label, text = "custom topology JSON", source
    else:
        path = Path(source)
        label = f"custom topology file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{label} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{label} cannot be read: {exc}") from exc
    try:
        return label, json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{label} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
