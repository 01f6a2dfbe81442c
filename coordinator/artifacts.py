"""Model artifacts: device model uploads and the consensus model, kept as files.

A job created with ``publish_model`` lets each participant upload its final
``model.onnx`` once training ends. The bytes go to ``{root}/{job_id}/{device_id}.onnx``
(written to a temporary file in the same directory, checked, then renamed: a reader never
sees half a file); a ``model_artifacts`` row records the sha256, size and time. The
consensus model (:mod:`coordinator.consensus`) is built lazily — on the first listing or
download after an upload — and cached as ``consensus.onnx`` with the ``{device: sha256}``
map it averaged, so it is rebuilt only after a new upload. A set of models that
cannot be averaged is recorded too (``error``) and shown in the listing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from coordinator.consensus import ConsensusError, average_models, parse_model
from coordinator.db import Job, ModelArtifact
from coordinator.errors import Conflict, NotFound
from meshfl.contract import JobArtifacts
from meshfl.contract import ModelArtifact as ModelArtifactBody
from meshfl.errors import ConfigError
from meshfl.modelspec import describe, is_custom, layout

if TYPE_CHECKING:
    import onnx  # annotations only: coordinator.consensus imports onnx when a model arrives

__all__ = ["CONSENSUS", "ArtifactStore", "Upload", "check_job_model"]

CONSENSUS = "consensus"
"""The artifact name of a job's consensus model."""


class Upload:
    """A model upload being received: a temporary file, its running sha256 and size.

    Feed it with :meth:`write`; :meth:`commit` renames it into place, :meth:`discard`
    removes it. ``max_bytes`` bounds the size (:class:`TooLarge` past it).
    """

    def __init__(self, directory: Path, max_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f".upload-{secrets.token_hex(8)}.tmp"
        self.max_bytes = max_bytes
        self.size = 0
        self._hash = hashlib.sha256()
        self._file = open(self.path, "wb")  # noqa: SIM115 — closed by commit/discard

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``; raises :class:`TooLarge` once the total passes ``max_bytes``."""
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise TooLarge(self.max_bytes)
        self._hash.update(chunk)
        self._file.write(chunk)

    def read_bytes(self) -> bytes:
        """Every byte written so far (flushed first)."""
        self._file.flush()
        return self.path.read_bytes()

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the bytes written so far."""
        return self._hash.hexdigest()

    def commit(self, target: Path) -> None:
        """Flush, fsync and atomically rename the file to ``target``."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.path, target)

    def discard(self) -> None:
        """Close and delete the temporary file (idempotent)."""
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class TooLarge(Exception):
    """An upload passed its byte limit (HTTP 413)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the model is over {max_bytes} bytes; raise max_model_bytes")
        self.max_bytes = max_bytes


class ArtifactStore:
    """The artifact files under ``root`` and their ``model_artifacts`` rows.

    Parameters
    ----------
    root
        Directory of the files (created on the first upload).
    max_bytes
        Largest upload accepted, bytes.

    """

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # one consensus build at a time

    def path(self, job_id: str, name: str) -> Path:
        """Where artifact ``name`` of ``job_id`` is kept."""
        return self.root / job_id / f"{name}.onnx"

    def begin(self, job_id: str) -> Upload:
        """Start receiving a model of ``job_id``."""
        return Upload(self.root / job_id, self.max_bytes)

    def store_device_model(
        self, session: Session, job: Job, device_id: str, upload: Upload, now: float
    ) -> ModelArtifactBody:
        """Check that ``upload`` is the job's model as ONNX, rename it into place, record it.

        A device uploading again replaces its model. Raises
        :class:`~coordinator.consensus.ConsensusError` (the file is removed) if it is not
        a self-contained ONNX model or not the job's model (:func:`check_job_model`).
        """
        try:
            model = parse_model(upload.read_bytes(), f"the uploaded file ({upload.size} bytes)")
            check_job_model(model, job.spec["model"])
        except ConsensusError:
            upload.discard()
            raise
        upload.commit(self.path(job.id, device_id))
        row = session.get(ModelArtifact, (job.id, device_id)) or ModelArtifact(
            job_id=job.id, name=device_id
        )
        row.sha256, row.size_bytes, row.created_at = upload.sha256, upload.size, now
        row.sources, row.error = None, None
        session.add(row)
        stale = session.get(ModelArtifact, (job.id, CONSENSUS))
        if stale is not None:  # rebuilt on the next request, even for identical bytes
            session.delete(stale)
        session.commit()
        return _public(row)

    def device_rows(self, session: Session, job: Job) -> list[ModelArtifact]:
        """The job's device uploads, by device id."""
        query = (
            select(ModelArtifact)
            .where(ModelArtifact.job_id == job.id, ModelArtifact.name != CONSENSUS)
            .order_by(ModelArtifact.name)
        )
        return list(session.scalars(query))

    def consensus(self, session: Session, job: Job, now: float) -> ModelArtifact | None:
        """The job's consensus row, rebuilt first if the uploads changed since.

        ``None`` when no device uploaded a model; a row with ``sha256`` ``None`` and an
        ``error`` when the uploads cannot be averaged.
        """
        devices = self.device_rows(session, job)
        if not devices:
            return None
        sources = {r.name: r.sha256 for r in devices}
        with self._lock:
            row = session.get(ModelArtifact, (job.id, CONSENSUS))
            if row is not None:
                session.refresh(row)  # another request may have rebuilt it meanwhile
                if row.sources == sources:
                    return row
            row = row or ModelArtifact(job_id=job.id, name=CONSENSUS)
            row.sources, row.created_at = sources, now
            try:
                data, _ = average_models((name, self._read(job, name)) for name in sources)
            except ConsensusError as exc:
                row.sha256, row.size_bytes, row.error = None, None, str(exc)
            else:
                upload = self.begin(job.id)
                try:
                    upload.write(data)
                except TooLarge:  # the mean of models under the limit is never larger
                    upload.discard()
                    raise
                upload.commit(self.path(job.id, CONSENSUS))
                row.sha256, row.size_bytes, row.error = upload.sha256, upload.size, None
            session.add(row)
            session.commit()
            return row

    def _read(self, job: Job, name: str) -> bytes:
        try:
            return self.path(job.id, name).read_bytes()
        except OSError as exc:
            raise ConsensusError(
                f"device {name}'s model file is unreadable in {self.root} ({exc.strerror});"
                " have the device upload it again"
            ) from None

    def listing(self, session: Session, job: Job, now: float) -> JobArtifacts:
        """Every device upload of ``job`` and its consensus (built if needed)."""
        consensus = self.consensus(session, job, now)
        return JobArtifacts(
            job_id=job.id,
            status=job.status,  # type: ignore[typeddict-item]
            devices=[_public(r) for r in self.device_rows(session, job)],
            consensus=None if consensus is None else _public(consensus),
        )

    def latest_consensus(
        self, session: Session, jobs: list[Job], now: float
    ) -> tuple[Job, ModelArtifact]:
        """The consensus of the most recently finished (completed) job that has one.

        Raises :class:`NotFound` when no completed job has a consensus model.
        """
        finished = [j for j in jobs if j.status == "completed"]
        for job in sorted(finished, key=lambda j: j.finished_at or 0.0, reverse=True):
            row = self.consensus(session, job, now)
            if row is not None and row.sha256 is not None:
                return job, row
        raise NotFound(
            "no completed job has a consensus model yet; run a job with publish_model"
            " (`meshfl job start --publish-model`, `meshfl local`)"
        )

    def require_consensus(self, session: Session, job: Job, now: float) -> ModelArtifact:
        """The job's consensus row; NotFound without uploads, Conflict if it failed."""
        row = self.consensus(session, job, now)
        if row is None:
            raise NotFound(
                f"job {job.id!r} has no uploaded device model; create it with publish_model"
                " and wait for its devices to finish"
            )
        if row.sha256 is None:
            raise Conflict(f"job {job.id!r} has no consensus model: {row.error}")
        return row


def _widths(values: Sequence[onnx.ValueInfoProto]) -> list[tuple[int | str, ...]]:
    """Each value's dims: an int where fixed, its symbol (or ``"?"``) where not."""
    shapes = []
    for value in values:
        dims = value.type.tensor_type.shape.dim
        shapes.append(tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                            for d in dims))  # fmt: skip
    return shapes


def check_job_model(model: onnx.ModelProto, spec: Mapping[str, Any]) -> None:
    """Refuse an uploaded ONNX model that is not the job's model (no torch needed).

    The graph must have one input (initializers aside) of shape ``[batch, input_dim]``
    and one output of shape ``[batch, num_classes]``, the spec's sizes. For a zoo model
    each initializer named like a ``state_dict`` entry of :func:`meshfl.modelspec.layout`
    must have that entry's shape: the TorchScript exporter keeps those names for every
    weight it does not fold (it folds e.g. a resnet's GroupNorm affine parameters into
    other constants, which are then not compared).

    Raises
    ------
    ConsensusError
        One line naming the first difference and the job's model (HTTP 422).

    """
    initializers = {t.name: tuple(t.dims) for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    want_in = ("batch", int(spec["input_dim"]))
    want_out = ("batch", int(spec["num_classes"]))
    what = f"the job's model {describe(spec)}"
    for kind, values, want in (
        ("input", inputs, want_in),
        ("output", model.graph.output, want_out),
    ):
        shapes = _widths(values)
        if len(shapes) != 1 or len(shapes[0]) != 2 or shapes[0][1] != want[1]:
            got = ", ".join(str(list(s)) for s in shapes) or "none"
            raise ConsensusError(
                f"the uploaded model's {kind} shape is {got} but {what} has {kind}"
                f" [batch, {want[1]}]; upload the model trained for this job"
            )
    if is_custom(spec):
        return
    try:
        expected = {name: shape for name, shape, _ in layout(spec)}
    except ConfigError:  # the coordinator checked the spec at creation; nothing to compare
        return
    for name, dims in initializers.items():
        if name in expected and dims != expected[name]:
            raise ConsensusError(
                f"the uploaded model's {name!r} is {list(dims)} but {what} has"
                f" {list(expected[name])}; upload the model trained for this job"
            )


def _public(row: ModelArtifact) -> ModelArtifactBody:
    return ModelArtifactBody(
        name=row.name,
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        created_at=row.created_at,
        devices=sorted(row.sources) if row.name == CONSENSUS and row.sources else [row.name],
        error=row.error,
    )
