"""Record-level DP (issue 22, item 2): the ``dp_unit`` option, its ε, and its spends.

ε of DP-SGD is checked against Opacus' ``RDPAccountant`` (an independent implementation
of the Poisson-subsampled Gaussian's RDP, Mironov et al. 2019) and against
``dp_accounting``'s ``RdpAccountant`` composed directly here; the coordinator's spends,
budgets and answers are checked over its REST API.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from test_coordinator_api import ADMIN_H, API
from test_coordinator_privacy import DP, Fleet, fleet  # noqa: F401

from coordinator.privacy import Spend, epsilon
from meshfl.aggregation.privacy import PrivacyOptions
from meshfl.errors import ConfigError

RECORD: dict[str, Any] = {**DP, "dp_unit": "record"}
BASE: dict[str, Any] = {"algorithm": "choco", "codec": "identity"}


def _options(**fields: Any) -> PrivacyOptions:
    return PrivacyOptions.from_spec({**BASE, **fields})


# --- the option ------------------------------------------------------------------------------


def test_the_unit_defaults_to_device_and_record_adds_no_noise_to_releases() -> None:
    device = _options(dp_noise_multiplier=1.0, dp_clip=1.0)
    record = _options(dp_noise_multiplier=1.0, dp_clip=1.0, dp_unit="record")
    assert device.unit == "device" and device.device_noise and not device.record_dp
    assert record.unit == "record" and record.record_dp and not record.device_noise
    assert record.private and record.dp  # still a private job: no sketch, no model upload
    assert record.noise_std_steps(0.01) == 0.0  # secure aggregation masks no DP noise
    # Releases are post-processing: D-PSGD's whole models and keyframes are fine.
    _options(dp_noise_multiplier=1.0, dp_clip=1.0, dp_unit="record", algorithm="dpsgd")
    _options(dp_noise_multiplier=1.0, dp_clip=1.0, dp_unit="record", keyframe_growth=3.0)
    # Secure aggregation still combines; its masks carry no DP noise and no release clip.
    secure = _options(dp_noise_multiplier=1.0, dp_clip=1.0, dp_unit="record",
                      secure_aggregation=2, codec="int8")  # fmt: skip
    assert secure.secure and secure.fixed_point("int8", 2) == _options(
        secure_aggregation=2, codec="int8").fixed_point("int8", 2)  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dp_unit": "example"}, "dp_unit must be 'device' or 'record'"),
        ({"dp_unit": "record"}, "dp_unit record runs DP-SGD: set dp_noise_multiplier > 0"),
        ({"dp_unit": "record", "dp_noise_multiplier": 1.0}, "needs dp_clip > 0"),
        ({"dp_unit": "record", "dp_clip": 1.0}, "dp_clip without dp_noise_multiplier"),
        ({"dp_unit": "record", "dp_noise_multiplier": -1.0, "dp_clip": 1.0}, "must be >= 0"),
        ({"dp_unit": "record", "dp_noise_multiplier": 1.0, "dp_clip": -1.0}, "must be >= 0"),
        (
            {"dp_unit": "record", "dp_noise_multiplier": 1.0, "dp_clip": 1.0,
             "dp_mode": "distributed", "secure_aggregation": 2},
            "dp_mode distributed does not apply",
        ),
    ],
)  # fmt: skip
def test_nonsense_is_refused_with_one_line(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        _options(**fields)
    assert "\n" not in str(caught.value)


def test_the_rest_api_refuses_the_same_things_and_stores_the_unit(fleet: Fleet) -> None:  # noqa: F811
    from test_coordinator_api import spec

    bad = fleet.client.post(f"{API}/jobs", json=spec(dp_unit="record"), headers=ADMIN_H)
    assert bad.status_code == 422 and "dp_unit record runs DP-SGD" in bad.text
    typo = fleet.client.post(
        f"{API}/jobs", json=spec(**{**RECORD, "dp_unit": "rec"}), headers=ADMIN_H
    )
    assert typo.status_code == 422
    job_id = fleet.create(**RECORD)
    shown = fleet.client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    assert shown["spec"]["dp_unit"] == "record"


# --- ε -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.01, 1.0, 1000), (32 / 180, 2.85, 180)])
def test_record_epsilon_matches_opacus_and_a_direct_rdp_composition(
    q: float, sigma: float, steps: int
) -> None:
    import dp_accounting
    from opacus.accountants import RDPAccountant

    opacus = RDPAccountant()
    opacus.history = [(sigma, q, steps)]
    textbook = dp_accounting.rdp.RdpAccountant()
    textbook.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )

    ours = epsilon([Spend(sigma, steps, q, "record")], 1e-5, "record")

    assert ours == pytest.approx(textbook.get_epsilon(1e-5), rel=1e-9)
    assert ours == pytest.approx(opacus.get_epsilon(1e-5), rel=0.02)
    if q == 0.01:
        assert ours == pytest.approx(2.10, abs=0.02)  # docs/privacy.md's figure


def test_each_unit_composes_what_protects_it() -> None:
    device_rows = [Spend(3.49, 30)]
    record_rows = [Spend(1.0, 300, 0.1, "record")]
    both = device_rows + record_rows
    assert epsilon(both, 1e-5, "device") == epsilon(device_rows, 1e-5)  # DP-SGD: no device ε
    record_only = epsilon(record_rows, 1e-5, "record")
    assert epsilon(both, 1e-5, "record") > record_only  # a device release protects records too
    with pytest.raises(ValueError, match="unit"):
        epsilon(both, 1e-5, "example")
    with pytest.raises(ValueError, match="sampling rates"):
        epsilon([Spend(1.0, 3, 0.0, "record")], 1e-5, "record")


# --- the coordinator's spends ------------------------------------------------------------------


def _spend(fleet: Fleet, job_id: str, device: str, body: dict[str, Any]) -> Any:  # noqa: F811
    url = f"{API}/jobs/{job_id}/privacy/{device}/spend"
    return fleet.client.post(url, json=body, headers=fleet.headers[device])


def test_the_coordinator_counts_dp_sgd_steps_at_their_sampling_rate(fleet: Fleet) -> None:  # noqa: F811
    job_id, ids = fleet.running(**RECORD, rounds=3)
    q = 32 / 180
    first = _spend(fleet, job_id, ids[0], {"round": 1, "releases": 6, "sampling_rate": q})
    again = _spend(fleet, job_id, ids[0], {"round": 1, "releases": 6, "sampling_rate": q})
    second = _spend(fleet, job_id, ids[0], {"round": 2, "releases": 6, "sampling_rate": q})
    no_rate = _spend(fleet, job_id, ids[1], {"round": 1, "releases": 6})
    bad_rate = _spend(fleet, job_id, ids[1], {"round": 1, "releases": 6, "sampling_rate": 1.5})

    assert first.status_code == again.status_code == second.status_code == 200
    expected = epsilon([Spend(1.0, 12, q, "record")], 1e-5, "record")
    assert second.json() == {"device_id": ids[0], "epsilon_spent": pytest.approx(expected),
                             "delta": 1e-5, "epsilon_budget": None, "releases": 12,
                             "unit": "record"}  # fmt: skip
    assert no_rate.status_code == bad_rate.status_code == 422
    assert "sampling_rate in (0, 1]" in no_rate.text
    job = fleet.client.get(f"{API}/jobs/{job_id}", headers=ADMIN_H).json()
    mine = next(d for d in job["devices"] if d["device_id"] == ids[0])
    assert mine["privacy_unit"] == "record"
    assert mine["epsilon_spent"] == pytest.approx(expected)
    per_unit = fleet.client.get(f"{API}/devices/{ids[0]}/privacy?unit=record", headers=ADMIN_H)
    assert per_unit.json()["epsilon_spent"] == pytest.approx(expected)
    assert fleet.privacy(ids[0]).json()["epsilon_spent"] == 0.0  # no device-level guarantee


def test_a_record_level_budget_refuses_the_step_that_would_cross_it(fleet: Fleet) -> None:  # noqa: F811
    q = 0.2
    fits = epsilon([Spend(1.0, 10, q, "record")], 1e-5, "record")
    over = epsilon([Spend(1.0, 15, q, "record")], 1e-5, "record")
    job_id, ids = fleet.running(**RECORD, rounds=3, dp_epsilon_budget=(fits + over) / 2)
    for rnd in (1, 2):
        body = {"round": rnd, "releases": 5, "sampling_rate": q}
        assert _spend(fleet, job_id, ids[0], body).status_code == 200
    refused = _spend(fleet, job_id, ids[0], {"round": 3, "releases": 5, "sampling_rate": q})
    assert refused.status_code == 409 and "privacy budget exhausted" in refused.text
    assert "for its records" in refused.text


def test_a_record_level_start_projects_the_steps_of_a_profiled_device(fleet: Fleet) -> None:  # noqa: F811
    ids = [fleet.enrol(f"pi-{k}") for k in range(4)]
    url = f"{API}/devices/{ids[0]}/profile"
    put = fleet.client.put(url, json={"train_samples": 100}, headers=fleet.headers[ids[0]])
    assert put.status_code == 200, put.text
    # 5 rounds × ⌈100/32⌉ = 20 steps at q = 0.32, σ = 1: ε ≈ 7.5 at δ = 1e-5.
    planned = epsilon([Spend(1.0, 20, 0.32, "record")], 1e-5, "record")
    job_id = fleet.create(**RECORD, rounds=5, dp_epsilon_budget=planned - 0.1)
    refused = fleet.start(job_id)
    assert refused.status_code == 409 and "20 new DP-SGD steps" in refused.text
    fine = fleet.create(**RECORD, rounds=5, dp_epsilon_budget=planned + 0.1)
    assert fleet.start(fine).status_code == 200
    assert math.isfinite(planned)


def test_report_json_names_the_privacy_unit() -> None:
    from meshfl.app.local.report import privacy_summary

    devices = [{"epsilon_spent": 3.0}, {"epsilon_spent": 7.5}, {"epsilon_spent": None}]
    job: Any = {"spec": {**RECORD, "dp_delta": 1e-6}, "devices": devices}
    assert privacy_summary(job) == {"unit": "record", "epsilon": 7.5, "delta": 1e-6}
    job["spec"] = DP
    assert privacy_summary(job) == {"unit": "device", "epsilon": 7.5, "delta": 1e-5}
    job["spec"] = {"codec": "identity"}
    assert privacy_summary(job) is None
