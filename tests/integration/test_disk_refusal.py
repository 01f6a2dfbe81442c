"""A disk that refuses loses no work (issue 25): every write an agent makes survives it.

Each test gives a component a folder on a small tmpfs, then has the disk refuse: remounted
read-only, or filled to the last byte. The component must go on (the error said once, in
one line) instead of raising out of the job. Mounting needs root; without it the read-only
case falls back to a folder without write permission, and the full case fails saying so
(it cannot be made honestly otherwise: nothing else gives ENOSPC on a folder).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_agent.checkpoint import Checkpoint, CheckpointStore
from edge_agent.health import HealthWriter
from edge_agent.outbox import Outbox
from edge_agent.resume import save_final_model
from edge_agent.trainer import Trainer
from meshfl.contract import ModelSpec

MODEL: ModelSpec = {"name": "mlp", "input_dim": 8, "num_classes": 3, "hidden": [16]}

Refuse = Callable[[], None]


def _mount(folder: Path) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], capture_output=True
    )
    return done.returncode == 0


@pytest.fixture(params=["read-only", "full"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Refuse]]:
    """A folder, and a function that makes its disk refuse every further write."""
    folder = tmp_path / "disk"
    mounted = _mount(folder)
    kind = request.param

    def refuse() -> None:
        if kind == "read-only" and mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        elif kind == "read-only":
            for path in [folder, *folder.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o555)
        else:  # fill it: one file takes every free byte
            fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError:
                pass
            finally:
                os.close(fd)

    if kind == "full" and not mounted:
        pytest.fail(
            "a full disk is a 256 KiB tmpfs, and mounting one needs root and mount(8):"
            " run the tests as root (as .ci/run does)"
        )
    try:
        yield folder, refuse
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=True)
        else:
            for path in [folder, *folder.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o755)


def _trainer() -> Trainer:
    return Trainer(MODEL, seed=1, learning_rate=0.1, batch_size=8, local_epochs=1)


def _checkpoint(trainer: Trainer, job: str = "job-1") -> Checkpoint:
    return Checkpoint(job, 2, 2, "s", trainer.spec_hash, trainer.params(),
                      trainer.shuffle_state())  # fmt: skip


def test_the_final_model_is_kept_in_memory_and_said_once_when_the_disk_refuses(
    disk: tuple[Path, Refuse], caplog: pytest.LogCaptureFixture
) -> None:
    folder, refuse = disk
    trainer = _trainer()
    refuse()
    with caplog.at_level(logging.WARNING):
        path = save_final_model(trainer, folder / "job-1" / "pi" / "model.pt")
    assert path == ""
    errors = [r for r in caplog.records if "cannot write the final model" in r.getMessage()]
    assert len(errors) == 1 and "\n" not in errors[0].getMessage()
    assert all(np.isfinite(v).all() for v in trainer.params().values())  # still in memory


def test_checkpoints_are_pruned_and_removed_without_raising_when_the_disk_refuses(
    disk: tuple[Path, Refuse],
) -> None:
    folder, refuse = disk
    trainer, store = _trainer(), CheckpointStore(folder, "pi")
    store.save(_checkpoint(trainer, "job-1"))
    store.save(_checkpoint(trainer, "job-2"))
    refuse()
    with pytest.raises(OSError):
        store.save(_checkpoint(trainer, "job-2"))  # the Resumer says it once and goes on
    store.prune(keep="job-2")  # a job start: PermissionError/EROFS on main
    store.remove("job-2")  # a job end


def test_the_health_file_says_once_and_stops_cleanly_when_the_disk_refuses(
    disk: tuple[Path, Refuse], caplog: pytest.LogCaptureFixture
) -> None:
    folder, refuse = disk
    health = HealthWriter(folder, "dev-1", "pi", lambda: True, interval_s=3600)
    health.write()
    refuse()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            health.write()
        health.stop()
    warnings = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1


def test_the_outbox_goes_on_in_memory_when_its_disk_refuses_mid_job(
    disk: tuple[Path, Refuse],
) -> None:
    folder, refuse = disk
    box = Outbox(folder=folder / "job-1.outbox")
    box.add(1, 1, [b"a" * 100], {"p", "q"})
    box.add(2, 2, [b"b" * 100], {"p"})
    refuse()
    assert [s for s, _ in box.after("p", 1)] == [2]  # acknowledges 1 for p: no unlink error
    assert [s for s, _ in box.after("q", 1)] == []  # 1 acknowledged by all: dropped
    box.add(3, 3, [b"c" * 100], {"p"})
    assert [s for s, _ in box.after("p", 1)] == [2, 3]  # (a full disk had room again)
