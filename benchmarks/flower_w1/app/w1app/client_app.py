"""ClientApp: train the received W1 model one local epoch on this SuperNode's partition.

The partition comes from the SuperNode's ``--node-config "partition-id=I"``; the data code
is ``flower_w1.w1`` (on ``PYTHONPATH``, set by ``benchmarks/w1_flower.py``).
"""

from __future__ import annotations

from flower_w1 import w1
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One local epoch of SGD on the partition; reply with the arrays and sample count."""
    cid = int(context.node_config["partition-id"])
    n = int(context.run_config["clients"])
    trivial = str(context.run_config["trivial"]) or None
    model = w1.build_model(bool(trivial))
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = w1.client_data(cid, n, trivial)
    seconds = w1.train(model, x, y, seed=1000 * int(msg.content["config"]["round"]) + cid)
    metrics = MetricRecord({"num-examples": len(x), "train_s": seconds})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)
