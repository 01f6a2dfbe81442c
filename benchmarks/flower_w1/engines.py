"""Flower's legacy gRPC API and its Ray simulation on W1 (FedAvg, central evaluation).

    python -m flower_w1.engines server --port P --clients 8 --rounds 30 --out R.json
    python -m flower_w1.engines client --port P --cid 3 --clients 8
    python -m flower_w1.engines sim --clients 8 --rounds 30 --out R.json

``--trivial CSV`` swaps in the 10-parameter linear model on that table. The server
evaluates the global model on the central test set after every round and writes
``R.json``: per round the accuracy, the wall-clock time (``time.time()``, seconds), the
serialized parameter bytes sent to and received from the clients (the ``Parameters``
tensors, i.e. numpy ``.npy`` bytes: what FedAvg puts in the gRPC messages, excluding
protobuf/gRPC/HTTP2 framing) and the slowest client's training seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import flwr as fl
import numpy as np
from flwr.common import FitIns, Parameters, ndarrays_to_parameters

from flower_w1 import w1


class W1Client(fl.client.NumPyClient):
    """One W1 device: trains the received model one local epoch, returns it."""

    def __init__(self, cid: int, n: int, trivial: str | None) -> None:
        self.cid, self.model = cid, w1.build_model(bool(trivial))
        self.x, self.y = w1.client_data(cid, n, trivial)

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        """The local model's arrays."""
        return w1.get_weights(self.model)

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[Any, int, dict[str, Any]]:
        """Train one local epoch from ``parameters``; the arrays, sample count, seconds."""
        w1.set_weights(self.model, parameters)
        seconds = w1.train(self.model, self.x, self.y, seed=1000 * int(config["round"]) + self.cid)
        return w1.get_weights(self.model), len(self.x), {"train_s": seconds}


class Recorder(fl.server.strategy.FedAvg):
    """FedAvg (all clients every round, no federated evaluation) that logs each round."""

    def __init__(self, n: int, trivial: str | None, out: Path) -> None:
        model = w1.build_model(bool(trivial))
        self.x_test, self.y_test = w1.test_data(trivial)
        self.model, self.out = model, out
        self.log: dict[str, Any] = {"t_server_start": time.time(), "rounds": []}
        self.pending: dict[str, Any] = {}
        super().__init__(
            fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n,
            min_evaluate_clients=0, min_available_clients=n,
            initial_parameters=ndarrays_to_parameters(w1.get_weights(model)),
            on_fit_config_fn=lambda rnd: {"round": rnd}, evaluate_fn=self._central,
        )  # fmt: skip

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: Any
    ) -> list[tuple[Any, FitIns]]:
        """FedAvg's instructions; records the round start and the bytes sent."""
        pairs = super().configure_fit(server_round, parameters, client_manager)
        now = time.time()
        self.log.setdefault("t_first_fit", now)
        size = sum(len(t) for t in parameters.tensors)
        self.pending = {
            "round": server_round,
            "t_start": now,
            "bytes_down": size * len(pairs),
        }
        return pairs

    def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
        """Records the bytes received and the slowest training, then averages."""
        self.pending["bytes_up"] = sum(len(t) for _, r in results for t in r.parameters.tensors)
        self.pending["clients"] = len(results)
        self.pending["failures"] = len(failures)
        self.pending["train_s_max"] = max(
            (float(r.metrics["train_s"]) for _, r in results), default=0.0
        )
        return super().aggregate_fit(server_round, results, failures)

    def _central(
        self, server_round: int, weights: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        w1.set_weights(self.model, weights)
        acc = w1.accuracy(self.model, self.x_test, self.y_test)
        if server_round == 0:
            self.log["initial_accuracy"] = acc
        else:
            self.log["rounds"].append({**self.pending, "accuracy": acc, "t_end": time.time()})
            self.out.write_text(json.dumps(self.log))
        return 0.0, {"accuracy": acc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["server", "client", "sim"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cid", type=int, default=0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--trivial", default=None)
    parser.add_argument("--out", type=Path, default=Path("flower_w1.json"))
    args = parser.parse_args()
    if args.role == "client":
        client = W1Client(args.cid, args.clients, args.trivial).to_client()
        fl.client.start_client(
            server_address=f"127.0.0.1:{args.port}", client=client, insecure=True
        )
        return
    strategy = Recorder(args.clients, args.trivial, args.out)
    config = fl.server.ServerConfig(num_rounds=args.rounds)
    if args.role == "server":
        fl.server.start_server(
            server_address=f"127.0.0.1:{args.port}", config=config, strategy=strategy
        )
    else:
        fl.simulation.start_simulation(
            client_fn=lambda context: W1Client(
                int(context.node_config["partition-id"]), args.clients, args.trivial
            ).to_client(),
            num_clients=args.clients, config=config, strategy=strategy,
        )  # fmt: skip
    strategy.log["t_done"] = time.time()
    args.out.write_text(json.dumps(strategy.log))


if __name__ == "__main__":
    main()
