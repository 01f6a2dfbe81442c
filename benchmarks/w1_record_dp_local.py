"""W1 on a real local fleet (`meshfl local`'s Python API) with record-level DP.

The same as ``meshfl local --dp-unit record --dp-noise-multiplier S --dp-clip C``. Every
other option is `meshfl local`'s default (CHOCO-SGD, sign codec, complete graph, local
momentum 0.9), except ``keyframe_growth`` 0, which the device-level checks of the local
launcher ask for whenever DP is on.

    python benchmarks/w1_record_dp_local.py --sigma 2.85 --clip 4 --out /tmp/w1-record
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meshfl.app.local import run as local_run
from meshfl.app.local.config import LocalConfig


def main() -> None:
    """Run one job and print its final accuracy and privacy block."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sigma", type=float, default=2.85)
    parser.add_argument("--clip", type=float, default=4.0)
    parser.add_argument("--model-seed", type=int, default=0, help="W1 keeps partition seed 0")
    parser.add_argument("--codec", default=None)
    parser.add_argument("--momentum", type=float, default=None)
    parser.add_argument("--out", type=Path, default=Path("meshfl-run-record-dp"))
    args = parser.parse_args()
    extra: dict[str, Any] = {}
    if args.codec:
        extra["codec"] = args.codec
    if args.momentum is not None:
        extra["local_momentum"] = args.momentum
    config = LocalConfig(
        dp_noise_multiplier=args.sigma, dp_clip=args.clip, dp_unit="record", keyframe_growth=0.0,
        model_seed=args.model_seed, out=args.out, **extra,
    )  # fmt: skip
    result = local_run.run_local(config)
    report = json.loads((args.out / "report.json").read_text())
    print(json.dumps({"final": report["final"], "privacy": report["privacy"],
                      "result": str(type(result).__name__)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
