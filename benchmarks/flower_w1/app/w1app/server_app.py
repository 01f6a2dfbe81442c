"""ServerApp: FedAvg over every SuperNode, the global model evaluated centrally per round.

Writes the same per-round log as ``flower_w1.engines`` to ``$FLOWER_W1_OUT``: accuracy,
``time.time()`` at the end of the round, serialized array bytes sent to and received from
the nodes (``Array.data``, npy bytes, without protobuf/gRPC framing), slowest training.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flower_w1 import w1
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

app = ServerApp()


def _size(arrays: ArrayRecord) -> int:
    return sum(len(a.data) for a in arrays.values())


class Recorder(FedAvg):
    """FedAvg that logs each round's bytes and training time."""

    def __init__(self, n: int, log: dict[str, Any]) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n,
                         min_available_nodes=n)  # fmt: skip
        self.log, self.pending = log, {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's messages; records the round start and the bytes sent."""
        config["round"] = server_round
        messages = list(super().configure_train(server_round, arrays, config, grid))
        now = time.time()
        self.log.setdefault("t_first_fit", now)
        self.pending = {"round": server_round, "t_start": now,
                        "bytes_down": _size(arrays) * len(messages)}  # fmt: skip
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        """Records the bytes received and the slowest training, then averages."""
        replies = list(replies)
        ok = [r for r in replies if not r.has_error()]
        self.pending["bytes_up"] = sum(_size(r.content["arrays"]) for r in ok)
        self.pending["clients"], self.pending["failures"] = (
            len(ok),
            len(replies) - len(ok),
        )
        self.pending["train_s_max"] = max(
            (float(r.content["metrics"]["train_s"]) for r in ok), default=0.0
        )
        return super().aggregate_train(server_round, replies)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` FedAvg rounds; write the log to ``$FLOWER_W1_OUT``."""
    out = Path(os.environ["FLOWER_W1_OUT"])
    n = int(context.run_config["clients"])
    trivial = str(context.run_config["trivial"]) or None
    log: dict[str, Any] = {"t_server_start": time.time(), "rounds": []}
    model = w1.build_model(bool(trivial))
    x_test, y_test = w1.test_data(trivial)
    strategy = Recorder(n, log)

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        acc = w1.accuracy(model, x_test, y_test)
        if server_round == 0:
            log["initial_accuracy"] = acc
        else:
            log["rounds"].append({**strategy.pending, "accuracy": acc, "t_end": time.time()})
            out.write_text(json.dumps(log))
        return MetricRecord({"accuracy": acc})

    strategy.start(grid, ArrayRecord(model.state_dict()),
                   num_rounds=int(context.run_config["num-server-rounds"]),
                   evaluate_fn=central)  # fmt: skip
    log["t_done"] = time.time()
    out.write_text(json.dumps(log))
