"""``meshfl bench frontier``: a tiny sweep end to end, and the γ choice."""

from __future__ import annotations

import json

import pytest

from meshfl.app.bench import frontier
from meshfl.app.bench.frontier import Curve, main
from meshfl.errors import ConfigError


def _curve(gamma, accuracy):
    return Curve("sign", "choco", gamma, accuracy, accuracy, [10.0] * len(accuracy), 0.0)


def test_reach_reports_first_round_and_cumulative_bytes():
    curve = _curve(1.0, [0.5, 0.81, 0.79, 0.9])
    assert curve.reach(0.8) == {"round": 2, "bytes": 20.0}
    assert curve.reach(0.95) is None


def test_choose_prefers_the_earliest_to_reach_then_the_best_final():
    early = _curve(0.6, [0.5, 0.85, 0.80])
    late = _curve(0.9, [0.5, 0.70, 0.95])
    never = _curve(0.3, [0.5, 0.6, 0.79])
    assert frontier._choose([late, never, early], 0.8) is early
    assert frontier._choose([never, _curve(1.0, [0.1, 0.2, 0.3])], 0.8) is never


def test_tiny_w1_sweep_writes_json_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(frontier, "GAMMAS", (0.6, 1.0))
    main("w1", ["sign", "identity"], rounds=3, seeds=1, out=tmp_path)
    document = json.loads((tmp_path / "frontier-W1.json").read_text())
    assert (tmp_path / "frontier-W1.png").stat().st_size > 1000
    identity, sign = document["results"]
    assert (identity["spec"], identity["gossip"], sign["spec"]) == ("identity", "dpsgd", "sign")
    assert identity["payload_bytes"] == [8 * 19_240] * 3
    # sign: one f32 scale and one bit per entry, per tensor (4 tensors of W1's MLP)
    per_device = sum(4 + -(-n // 8) for n in (64 * 64, 64, 64 * 10, 10))
    assert sign["payload_bytes"] == [8 * per_device] * 3
    assert sign["gamma"] in (0.6, 1.0) and len(document["all_gammas"]) == 2
    assert document["reference"]["accuracy"] == identity["mean_accuracy"][-1]
    assert 0.0 <= document["pooled_accuracy"] <= 1.0
    printed = capsys.readouterr().out
    assert "W1 digits-8" in printed and "| sign | choco |" in printed


@pytest.mark.parametrize("kwargs", [{"workload": "W9"}, {"rounds": 0}, {"specs": ["topk:2"]}])
def test_bad_arguments_raise_config_error(tmp_path, kwargs):
    args = {"workload": "W1", "specs": ["sign"], "rounds": 2, "seeds": 1, "out": tmp_path}
    with pytest.raises(ConfigError):
        main(**{**args, **kwargs})


def test_a_diverged_gamma_is_recorded_and_left_out(tmp_path, monkeypatch):
    from meshfl.app.local.lab import lockstep
    from meshfl.errors import CodecError

    real = lockstep.run_lockstep

    def fake(config, seed, **kwargs):
        if config.consensus_step == 1.0 and config.codec == "sign":
            raise CodecError("tensor contains NaN or inf; refusing to encode it")
        return real(config, seed, **kwargs)

    monkeypatch.setattr(lockstep, "run_lockstep", fake)
    monkeypatch.setattr(frontier, "GAMMAS", (0.6, 1.0))
    main("W1", ["sign"], rounds=2, seeds=1, out=tmp_path)
    document = json.loads((tmp_path / "frontier-W1.json").read_text())
    assert [r["diverged"] for r in document["all_gammas"]] == [False, True]
    assert document["results"][1]["gamma"] == 0.6
