"""The consensus model: the parameter mean of a job's device models, built on ONNX files.

The coordinator knows a model only as a file; it never imports torch or the model zoo.
Every device of a decentralized job ends with its own model x_i; the *consensus model*
is x̄ = (1/n) Σ_i x_i, the average the gossip iterations drive every x_i towards (the
consensus distance mean ‖x_i − x̄‖² of Koloskova et al., ICML 2019, is measured around
it). It is built here by averaging the ONNX initializers (``onnx.numpy_helper``) of the
uploaded models, which must share one graph: the same opsets, graph inputs and outputs,
node list, and initializer names, shapes and dtypes. Floating-point initializers are
averaged in float64 and rounded once to their own dtype; any other initializer (an
integer shape constant) must be identical on every device and is kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from coordinator.errors import Conflict

if TYPE_CHECKING:
    import onnx

__all__ = ["ConsensusError", "average_models", "decode", "parse_model"]


class ConsensusError(Conflict):
    """The device models cannot be averaged (different graphs, or not ONNX); HTTP 409."""


def parse_model(data: bytes, what: str) -> onnx.ModelProto:
    """Parse ONNX bytes (protobuf, no code runs); ConsensusError naming ``what`` if invalid."""
    import onnx  # here, not at module level: ~10 MiB a coordinator pays only once models arrive

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError is not a public type
        raise ConsensusError(f"{what} is not an ONNX model ({type(exc).__name__})") from None
    if not model.HasField("graph") or not model.graph.node:
        raise ConsensusError(f"{what} is not an ONNX model (it has no graph nodes)")
    if model.graph.sparse_initializer or any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer
    ):
        raise ConsensusError(
            f"{what} uses sparse or external-data initializers; export it as one self-contained"
            " file"
        )
    for tensor in model.graph.initializer:  # every value decodes now, not at each listing
        decode(tensor, what)
    return model


def decode(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """An initializer's values as an array of its declared shape; ConsensusError if malformed.

    ``onnx.numpy_helper.to_array`` raises whatever numpy raises on a tensor whose data
    does not match its dims or type (``ValueError``, ``TypeError``, ...); here that is a
    ConsensusError naming the initializer, so an upload is refused once (422) and a
    stored file never makes a listing fail with a 500.
    """
    from onnx import numpy_helper

    try:
        array = numpy_helper.to_array(tensor)
        if tuple(array.shape) != tuple(tensor.dims):
            raise ValueError(f"{list(array.shape)} values for dims {list(tensor.dims)}")
    except Exception as exc:  # numpy/onnx raise many types on malformed protobuf data
        text = " ".join(str(exc).split())[:160]
        raise ConsensusError(
            f"{what} has a malformed initializer {tensor.name[:80]!r} ({type(exc).__name__}:"
            f" {text}); export the model again"
        ) from None
    return np.asarray(array)


@dataclass(frozen=True)
class _Structure:
    """Everything but the initializer values, in a comparable form."""

    opsets: tuple[tuple[str, int], ...]
    inputs: tuple[bytes, ...]
    outputs: tuple[bytes, ...]
    nodes: tuple[bytes, ...]
    initializers: tuple[tuple[str, tuple[int, ...], int], ...]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> _Structure:
        graph = model.graph
        return cls(
            opsets=tuple((o.domain, o.version) for o in model.opset_import),
            inputs=tuple(v.SerializeToString(deterministic=True) for v in graph.input),
            outputs=tuple(v.SerializeToString(deterministic=True) for v in graph.output),
            nodes=tuple(n.SerializeToString(deterministic=True) for n in graph.node),
            initializers=tuple((t.name, tuple(t.dims), t.data_type) for t in graph.initializer),
        )

    def difference(self, other: _Structure) -> str | None:
        """The first way ``other`` differs from this structure, in words; None if equal."""
        if self.initializers != other.initializers:
            mine = {name: (dims, dt) for name, dims, dt in self.initializers}
            theirs = {name: (dims, dt) for name, dims, dt in other.initializers}
            for name in sorted(mine.keys() ^ theirs.keys()):
                return f"initializer {name!r} exists in only one of them"
            for name in mine:
                if mine[name] != theirs[name]:
                    (d1, t1), (d2, t2) = mine[name], theirs[name]
                    return (
                        f"initializer {name!r} is {list(d1)} {_dtype(t1)} vs {list(d2)}"
                        f" {_dtype(t2)}"
                    )
            return "the initializers are in a different order"
        for field in ("opsets", "inputs", "outputs", "nodes"):
            if getattr(self, field) != getattr(other, field):
                mine_n, theirs_n = len(getattr(self, field)), len(getattr(other, field))
                extra = f" ({mine_n} vs {theirs_n})" if mine_n != theirs_n else ""
                return f"their graph {field} differ{extra}"
        return None


def _dtype(data_type: int) -> str:
    import onnx  # loaded already: only called on a parsed model

    return str(onnx.TensorProto.DataType.Name(data_type)).lower()


def average_models(models: Iterable[tuple[str, bytes]]) -> tuple[bytes, list[str]]:
    """Average the initializers of ONNX models that share one graph.

    Parameters
    ----------
    models
        ``(device_id, onnx_bytes)`` pairs, at least one; parsed one at a time, so memory
        holds the float64 sums, the first model and one other.

    Returns
    -------
    tuple[bytes, list[str]]
        The consensus model (the first model's graph and metadata with averaged
        initializers and a ``meshfl.consensus_of`` metadata entry listing the device ids),
        serialized deterministically; and the averaged device ids, in input order.

    Raises
    ------
    ConsensusError
        No model, a file that is not self-contained ONNX, or two models whose graphs
        differ (the message names both devices and the first difference).

    """
    import onnx  # here, not at module level: ~10 MiB a coordinator pays only once models arrive
    from onnx import numpy_helper

    first: onnx.ModelProto | None = None
    reference: _Structure | None = None
    first_id = ""
    sums: dict[str, np.ndarray] = {}
    fixed: dict[str, np.ndarray] = {}
    devices: list[str] = []
    for device_id, data in models:
        model = parse_model(data, f"device {device_id}'s model")
        structure = _Structure.of(model)
        if reference is None:
            first, reference, first_id = model, structure, device_id
        else:
            why = reference.difference(structure)
            if why is not None:
                raise ConsensusError(
                    f"cannot average device {first_id}'s and device {device_id}'s models: {why};"
                    " every device of a job must export the same model"
                )
        for tensor in model.graph.initializer:
            array = decode(tensor, f"device {device_id}'s model")
            if _averaged(array):
                sums.setdefault(tensor.name, np.zeros(array.shape, np.float64))
                sums[tensor.name] += array.astype(np.float64)
            elif tensor.name not in fixed:
                fixed[tensor.name] = array
            elif not np.array_equal(fixed[tensor.name], array):
                raise ConsensusError(
                    f"cannot average device {first_id}'s and device {device_id}'s models: their"
                    f" non-float initializer {tensor.name!r} differs; every device of a job must"
                    " export the same model"
                )
        devices.append(device_id)
    if first is None:
        raise ConsensusError("no device model was uploaded for this job yet")
    initializers = []
    for tensor in first.graph.initializer:
        if tensor.name in sums:
            dtype = decode(tensor, f"device {first_id}'s model").dtype
            mean = (sums[tensor.name] / len(devices)).astype(dtype)
            initializers.append(numpy_helper.from_array(mean, tensor.name))
        else:
            kept = onnx.TensorProto()
            kept.CopyFrom(tensor)
            initializers.append(kept)
    del first.graph.initializer[:]
    first.graph.initializer.extend(initializers)
    entry = first.metadata_props.add()
    entry.key, entry.value = "meshfl.consensus_of", ",".join(devices)
    return first.SerializeToString(deterministic=True), devices


def _averaged(array: np.ndarray) -> bool:
    """Floating-point tensors (float16/32/64, bfloat16 via ml_dtypes) are averaged."""
    return array.dtype.kind == "f" or array.dtype.name == "bfloat16"
