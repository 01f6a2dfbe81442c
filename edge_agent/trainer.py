"""Local training of the job's model: the only module of ``edge_agent`` that imports torch.

Minibatch SGD (W1: learning rate 0.1, batch 32, one local epoch per round), optionally
with heavy-ball momentum kept across rounds, with the shuffling drawn from a per-device
``torch.Generator`` so a run is reproducible.

With record-level differential privacy (``dp_unit`` ``record``) every step is DP-SGD
instead (:mod:`edge_agent.dp_sgd`: Poisson-sampled batches, per-example clipping to C,
Gaussian noise σC on the sum, divided by the expected batch size), and momentum applies
to the privatized gradient.

For tests and benchmarks a trainer can play a slower device honestly: with ``slowdown``
s > 1 it sleeps (s − 1)·t after every optimizer step that took t seconds, so its training
(and the throughput it measures for the capability profile) is s times slower than this
machine's, whatever the load.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_agent.dp_sgd import DPSGD, RecordDP
from edge_agent.local_step import LocalStep, check_momentum
from meshfl.contract import ModelSpec, PrivacySpend
from meshfl.errors import ConfigError, DataError
from meshfl.files import atomic_write
from models.arrays import load_arrays, spec_hash, to_arrays
from models.data import check_model_fit
from models.zoo import build_model

__all__ = ["TrainResult", "Trainer", "accelerator_name"]

_EVAL_CHUNK = 4096  # samples per forward pass in evaluate()


@dataclass(frozen=True)
class TrainResult:
    """One call of :meth:`Trainer.train`: mean per-sample loss, work done, seconds.

    ``samples`` and ``steps`` count the minibatches actually run (``len(x) ×
    local_epochs`` samples in ``local_epochs · ceil(len(x) / batch_size)`` steps at
    ``work_fraction`` 1); ``seconds`` is wall-clock, slowdown sleeps included.
    """

    loss: float
    samples: int
    seconds: float
    steps: int


def accelerator_name() -> str | None:
    """``"cuda:<device name>"`` when torch sees a CUDA device, else None."""
    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return None


def _check_step_time(step_time_s: float) -> float:
    """Return ``step_time_s`` as a float; ConfigError unless it is a finite number ≥ 0."""
    ok = not isinstance(step_time_s, bool) and isinstance(step_time_s, (int, float))
    if not (ok and math.isfinite(step_time_s) and step_time_s >= 0):
        raise ConfigError(f"step time must be a finite number >= 0 s (got {step_time_s!r})")
    return float(step_time_s)


def _check_slowdown(slowdown: float) -> float:
    """Return ``slowdown`` as a float; ConfigError unless it is a finite number ≥ 1."""
    ok = not isinstance(slowdown, bool) and isinstance(slowdown, (int, float))
    if not (ok and math.isfinite(slowdown) and slowdown >= 1):
        raise ConfigError(f"slowdown must be a finite number >= 1 (got {slowdown!r})")
    return float(slowdown)


def _positive(name: str, value: float, integer: bool) -> None:
    bad_type = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad_type or (integer and not isinstance(value, int)) or not value > 0:
        raise ConfigError(f"{name} must be a positive {'integer' if integer else 'number'}")


class Trainer:
    """The job's model on this device, trained with SGD (heavy ball optional) on the CPU.

    Parameters
    ----------
    spec : ModelSpec
        The job's model, built by :func:`models.zoo.build_model`.
    seed : int
        Initialisation seed: every device with the same spec and seed starts identical.
    learning_rate : float
        SGD step size η (> 0), no weight decay.
    batch_size : int
        Samples per minibatch (≥ 1); the last minibatch of an epoch may be smaller.
    local_epochs : int
        Passes over the local data per :meth:`train` call (≥ 1).
    threads : int, default 1
        ``torch.set_num_threads`` (process-wide).
    data_seed : int, optional
        Seed of this device's shuffling generator; None uses ``seed``. Give each device its
        own (e.g. ``seed + index``) for independent minibatch orders.
    slowdown : float, default 1.0
        Play a device this many times slower (≥ 1): after each optimizer step that took
        t seconds (forward, backward, update), sleep until it took
        ``slowdown · max(t, step_time_s)``. It applies to :meth:`train` and
        :meth:`measure_throughput` alike. For tests and benchmarks.
    step_time_s : float, default 0.0
        Emulated step time of the device, seconds (≥ 0; WORKLOADS.md's W6: 0.05): every
        optimizer step takes at least this long (times ``slowdown``), the trainer
        sleeping the difference, so that a machine hosting many agents does not decide
        how fast each one is. 0: the real step time.
    momentum : float, default 0.0
        Local momentum β in [0, 1); 0: plain SGD. The buffer lives as long as the
        trainer — across rounds and across the gossip's mixing — and is saved and
        restored by the agent's checkpoint (:meth:`momentum_state`).
    momentum_kind : str, default "heavy-ball"
        How β applies (:mod:`edge_agent.local_step`): ``heavy-ball`` (Polyak 1964,
        ``torch.optim.SGD``'s: ``v ← β v + g``, ``x ← x − η v``) or ``quasi-global``
        (Lin et al., ICML 2021: ``x ← x − η (g + β m̂)``, m̂ following the mixed model's
        change; :meth:`finish_round` updates it).
    dp_sgd : tuple of (float, float), optional
        ``(σ, C)``: train with DP-SGD (record-level DP, :mod:`edge_agent.dp_sgd`) with
        noise multiplier σ and per-example clipping norm C; each epoch is
        ``ceil(n / batch_size)`` steps on Poisson samples at rate q = batch_size / n.
        None: ordinary shuffled minibatches.
    dp_seed : int, optional
        Seed of DP-SGD's sampling and noise (tests only); None: from the OS.

    Raises
    ------
    ConfigError
        A non-positive hyper-parameter, a slowdown below 1 or not finite, a negative or
        non-finite step time, a momentum
        outside [0, 1), a bad model spec, σ or C not > 0, or DP-SGD on a model with
        BatchNorm.

    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        seed: int,
        learning_rate: float,
        batch_size: int,
        local_epochs: int,
        threads: int = 1,
        data_seed: int | None = None,
        slowdown: float = 1.0,
        step_time_s: float = 0.0,
        momentum: float = 0.0,
        momentum_kind: str = "heavy-ball",
        dp_sgd: tuple[float, float] | None = None,
        dp_seed: int | None = None,
    ) -> None:
        self.slowdown = _check_slowdown(slowdown)
        self.step_time_s = _check_step_time(step_time_s)
        check_momentum(momentum)  # refused before the model is built
        _positive("learning rate", learning_rate, integer=False)
        _positive("batch size", batch_size, integer=True)
        _positive("local epochs", local_epochs, integer=True)
        _positive("threads", threads, integer=True)
        torch.set_num_threads(threads)
        self.spec = spec
        self.learning_rate = float(learning_rate)
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        self._model = build_model(spec, seed)
        self._generator = torch.Generator().manual_seed(seed if data_seed is None else data_seed)
        self._loss = nn.CrossEntropyLoss()
        self._local = LocalStep(self._model, self.learning_rate, momentum, momentum_kind)
        self._dp: DPSGD | None = None
        if dp_sgd is not None:
            config = RecordDP(*dp_sgd)
            self._dp = DPSGD(self._model, self._loss, config, batch_size, dp_seed)

    @property
    def momentum(self) -> float:
        """The local momentum β in [0, 1) (0: plain SGD), as :class:`LocalStep` holds it."""
        return self._local.momentum

    @property
    def record_dp(self) -> RecordDP | None:
        """DP-SGD's σ and C when this trainer runs record-level DP, else None."""
        return None if self._dp is None else self._dp.config

    def steps(self, n: int, work_fraction: float = 1.0) -> int:
        """Optimizer steps :meth:`train` runs on ``n`` examples at ``work_fraction``."""
        per_epoch = math.ceil(n / self.batch_size)
        return max(1, round(work_fraction * self.local_epochs * per_epoch))

    def dp_spend(self, n: int, round_: int, releases: int) -> PrivacySpend:
        """The spend to record before round ``round_`` (``POST .../privacy/.../spend``).

        With DP-SGD: the steps of a full :meth:`train` call on ``n`` examples (the
        planner's ``work_fraction`` can only lower them: over-counting is the safe side),
        each a Poisson-subsampled Gaussian mechanism at ``sampling_rate`` q = B / n.
        Otherwise the round's ``releases`` device-level releases, unchanged.
        """
        if self._dp is None:
            return {"round": round_, "releases": releases}
        q = RecordDP.sampling_rate(n, self.batch_size)
        return {"round": round_, "releases": self.steps(n), "sampling_rate": q}

    @property
    def spec_hash(self) -> str:
        """sha256 of the model's tensor names, shapes and dtypes (see ``models.arrays``)."""
        return spec_hash(self._model)

    def params(self) -> dict[str, np.ndarray]:
        """Return copies of the parameters, ordered by ``state_dict``, float32."""
        return to_arrays(self._model)

    def set_params(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Replace the parameters; ConfigError names a missing, extra or mis-shaped tensor."""
        load_arrays(self._model, arrays)

    def finish_round(self, mixed: Mapping[str, np.ndarray]) -> None:
        """End a round with its mixed model: :meth:`set_params`, then the momentum's update.

        Quasi-global momentum takes the round's model change into m̂ here; the other
        kinds only set the parameters.
        """
        self.set_params(mixed)
        self._local.end_round(mixed)

    def shuffle_state(self) -> np.ndarray:
        """The state of the shuffling generator: a 1-D uint8 array (5,056 bytes on CPU).

        With :meth:`set_shuffle_state` a resumed job draws the same minibatch orders as
        one that never stopped (:mod:`edge_agent.checkpoint`).
        """
        return self._generator.get_state().numpy().copy()

    def set_shuffle_state(self, state: np.ndarray) -> None:
        """Restore a state from :meth:`shuffle_state`; ConfigError if it is not one."""
        array = np.asarray(state)
        if array.dtype != np.uint8 or array.ndim != 1:
            raise ConfigError(
                f"a shuffle state is a 1-D uint8 array, got {array.dtype} {array.shape}"
            )
        try:
            self._generator.set_state(torch.from_numpy(array.copy()))
        except RuntimeError as exc:
            raise ConfigError(f"not a shuffle state of this trainer ({exc})") from None

    def momentum_state(self) -> dict[str, np.ndarray]:
        """Copies of the momentum buffers (v or m̂), float32, keyed by parameter name.

        Empty with ``momentum`` 0 or before the first step. With
        :meth:`set_momentum_state` a resumed job continues the same trajectory.
        """
        return self._local.state()

    def set_momentum_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore buffers from :meth:`momentum_state` (every parameter's, or none).

        Raises
        ------
        ConfigError
            Buffers given to a trainer without momentum, or a missing, extra or
            mis-shaped buffer.

        """
        if arrays:
            self._local.load_state(arrays)

    def _tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        check_model_fit(x, y, self.spec)
        if len(y) == 0:
            raise DataError("device data holds no samples; give the device a non-empty data file")
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
        return xt, yt

    def _step(self, xb: torch.Tensor, yb: torch.Tensor) -> float:
        """One SGD step on a minibatch (then the slowdown sleep); returns its mean loss.

        With DP-SGD the gradient is the privatized g̃ (NaN loss for an empty sample).
        """
        start = time.perf_counter()
        self._model.zero_grad(set_to_none=True)
        if self._dp is not None:
            noised, value = self._dp.noised_gradient(xb, yb)
            for name, p in self._model.named_parameters():
                p.grad = noised[name]
        else:
            loss = self._loss(self._model(xb), yb)
            loss.backward()
            value = float(loss.detach())
        self._local.step()
        took = time.perf_counter() - start
        emulated = self.slowdown * max(took, self.step_time_s)
        if emulated > took:
            time.sleep(emulated - took)
        return value

    def _epoch(
        self, xt: torch.Tensor, yt: torch.Tensor, generator: torch.Generator, max_batches: int
    ) -> tuple[float, int]:
        if self._dp is not None:  # Poisson samples, as many steps as an ordinary epoch
            per_epoch = math.ceil(len(yt) / self.batch_size)
            batches = [self._dp.sample(len(yt)) for _ in range(min(per_epoch, max_batches))]
        else:
            order = torch.randperm(len(yt), generator=generator)
            batches = list(torch.split(order, self.batch_size)[:max_batches])
        total, seen = 0.0, 0
        for batch in batches:
            loss = self._step(xt[batch], yt[batch])
            if len(batch):
                total, seen = total + loss * len(batch), seen + len(batch)
        return total, seen

    def train(self, x: np.ndarray, y: np.ndarray, work_fraction: float = 1.0) -> TrainResult:
        """Run (part of) ``local_epochs`` epochs of shuffled-minibatch SGD on (x, y), in place.

        Parameters
        ----------
        x : numpy.ndarray
            Features, (n, input_dim), cast to float32.
        y : numpy.ndarray
            Labels, (n,), integers in [0, num_classes).
        work_fraction : float, default 1.0
            Share of the round's work to do, in (0, 1]: the first
            ``max(1, round(work_fraction · local_epochs · ceil(n / batch_size)))``
            minibatch steps of the ``local_epochs`` epochs (the planner's per-device local
            steps, OmniLearn-style). Each epoch started draws its own shuffle.

        Returns
        -------
        TrainResult
            Mean cross-entropy over every sample processed (before each step's update),
            the samples and steps run, wall-clock seconds.

        Raises
        ------
        ConfigError
            ``work_fraction`` outside (0, 1].
        DataError
            Empty data, a width other than ``input_dim``, or a label ≥ ``num_classes``.

        """
        ok = not isinstance(work_fraction, bool) and isinstance(work_fraction, (int, float))
        if not (ok and 0 < work_fraction <= 1):
            raise ConfigError(f"work fraction must be in (0, 1] (got {work_fraction!r})")
        xt, yt = self._tensors(x, y)
        self._model.train()
        per_epoch = math.ceil(len(yt) / self.batch_size)
        steps = self.steps(len(yt), work_fraction)
        self._local.begin_round()
        start = time.perf_counter()
        total, seen, left = 0.0, 0, steps
        while left > 0:
            epoch_total, epoch_seen = self._epoch(xt, yt, self._generator, left)
            total, seen, left = total + epoch_total, seen + epoch_seen, left - per_epoch
        loss = total / seen if seen else 0.0  # DP-SGD: every Poisson sample may be empty
        return TrainResult(loss, seen, time.perf_counter() - start, steps)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Return (accuracy in [0, 1], mean cross-entropy) on (x, y); DataError when empty."""
        if len(y) == 0:
            raise DataError("the test set holds no samples; give the job a non-empty test file")
        xt, yt = self._tensors(x, y)
        self._model.eval()
        correct, loss = 0, 0.0
        with torch.no_grad():
            for start in range(0, len(yt), _EVAL_CHUNK):
                logits = self._model(xt[start : start + _EVAL_CHUNK])
                labels = yt[start : start + _EVAL_CHUNK]
                loss += float(self._loss(logits, labels)) * len(labels)
                correct += int((logits.argmax(dim=1) == labels).sum())
        self._model.train()
        return correct / len(yt), loss / len(yt)

    def measure_throughput(self, x: np.ndarray, y: np.ndarray, batches: int = 20) -> float:
        """Training speed in samples per second on the job's model and batch size.

        Times ``batches`` SGD steps (after one untimed warm-up step) on minibatches of
        (x, y), then restores the parameters; the shuffling generator of :meth:`train` is
        not advanced, so measuring does not change later training. The steps are
        :meth:`train`'s, slowdown sleeps included: a slowed trainer measures the slowed
        device.
        """
        _positive("batches", batches, integer=True)
        xt, yt = self._tensors(x, y)
        saved, velocity = self.params(), self.momentum_state()
        generator = torch.Generator().manual_seed(0)
        try:
            self._model.train()
            self._epoch(xt, yt, generator, 1)
            per_epoch = math.ceil(len(yt) / self.batch_size)
            done, samples, start = 0, 0, time.perf_counter()
            while done < batches:
                _, seen = self._epoch(xt, yt, generator, batches - done)
                done += min(batches - done, per_epoch)
                samples += seen
            seconds = time.perf_counter() - start
        finally:
            self.set_params(saved)
            self._local.load_state(velocity)  # measuring leaves no momentum behind
        return samples / max(seconds, 1e-9)

    def save(self, path: Path) -> None:
        """Write the model atomically: ``path`` (torch ``state_dict``) and its ``.npz`` twin.

        ``path`` is written with ``torch.save`` (load with ``weights_only=True``); the same
        arrays go to ``path.with_suffix(".npz")`` (``path + ".npz"`` when ``path`` already
        ends in ``.npz``). Each file is written to a temporary name and renamed.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        npz = path.with_suffix(".npz") if path.suffix != ".npz" else Path(f"{path}.npz")
        state = {k: v.detach().clone() for k, v in self._model.state_dict().items()}
        atomic_write(path, lambda handle: torch.save(state, handle))
        arrays = self.params()
        atomic_write(npz, lambda handle: np.savez(handle, **arrays))  # type: ignore[arg-type]

    def export_onnx(self, path: Path, x: np.ndarray | None = None) -> float | None:
        """Export the model to the ONNX file ``path``; return its parity on ``x``.

        Parameters
        ----------
        path : Path
            Destination, written atomically by :func:`models.onnx.export_onnx` (input
            ``"input"`` float32 ``[batch, input_dim]``, output ``"logits"``).
        x : numpy.ndarray, optional
            ``(n, input_dim)`` inputs, e.g. the device's test set.

        Returns
        -------
        float or None
            ``max |logit(torch) − logit(onnxruntime)|`` over ``x`` (issue 8 wants
            ≤ 1e-5); None when ``x`` is None or empty.

        Raises
        ------
        ConfigError
            onnxruntime cannot run the exported file; torch's exporter errors pass through.

        """
        from models.onnx import export_checked

        # In a short forked child: the exporter's and onnxruntime's memory is not kept.
        return export_checked(self._model, Path(path), int(self.spec["input_dim"]), x)
