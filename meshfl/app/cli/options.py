"""A job's command-line options, built from the one table (:mod:`meshfl.contract.job_options`).

:func:`with_job_options` gives ``meshfl job start`` and ``meshfl local`` one Typer option
per table entry; neither writes a job option's name, type, default or help itself.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from meshfl.app.cli.option_group import option_group
from meshfl.contract.job_options import JOB_OPTIONS, LAUNCHER_DEFAULTS, JobOption

__all__ = ["RECORD_DP_CODEC", "SECURE_DEFAULT_CODEC", "privacy_defaults", "with_job_options"]

_COMMAND_LINE = tuple(o for o in JOB_OPTIONS if o.command_line)


def _parameter(option: JobOption) -> inspect.Parameter:
    """The Typer parameter of ``option``, its default from :data:`LAUNCHER_DEFAULTS`."""
    default = LAUNCHER_DEFAULTS[option.field]
    kind = option.kind if default is not None else option.kind | None
    # An off-by-default switch is one flag (--plan), not a pair (--plan/--no-plan): the
    # pair's second column would narrow every help text in an 80-column terminal.
    flags = [option.flag] if option.kind is bool and default is False else []
    return inspect.Parameter(
        option.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind, typer.Option(*flags, help=option.help, metavar=option.metavar)],
    )


def _job(**values: Any) -> dict[str, Any]:
    """Every job option keyed by ``JobSpec`` field: those given, the others' defaults."""
    return {**LAUNCHER_DEFAULTS, **{o.field: values[o.name] for o in _COMMAND_LINE}}


_job.__signature__ = inspect.Signature([_parameter(o) for o in _COMMAND_LINE])  # type: ignore[attr-defined]

with_job_options = option_group(_job, into="job")
"""Give a Typer command one option per command-line entry of
:data:`~meshfl.contract.job_options.JOB_OPTIONS` (defaults: ``LAUNCHER_DEFAULTS``); the
command's ``job: dict[str, Any]`` parameter receives every job option, keyed by
``JobSpec`` field."""


SECURE_DEFAULT_CODEC = "int8"
"""The codec a secure job uses when the codec option was left at its default (sign,
which cannot be masked)."""

RECORD_DP_CODEC = "identity"
"""The codec a record-level DP job uses when the codec option was left at its default."""


def privacy_defaults(job: dict[str, Any]) -> str:
    """Swap the defaults of ``job`` that cannot work with secure aggregation or DP.

    With ``--secure-aggregation``, a codec left at the default (sign) becomes int8; with
    it or with DP, keyframes left at the default turn off (a keyframe is an unmasked
    model). With record-level DP (DP-SGD), a codec and a local momentum left at their
    defaults become identity and 0: on W1 at ε = 8 the defaults reach 0.39, identity
    without momentum 0.861 (BENCHMARKS.md, record-level DP); a quasi-global momentum
    keeps its β (the user chose it). Options the user gave
    explicitly are kept (and refused with the reason if they cannot work). ``job`` maps
    ``JobSpec`` fields to values and is changed in place. Returns a note saying what
    changed (``""`` when nothing did).
    """
    from meshfl.codecs import parse_codec

    secure, dp = job["secure_aggregation"] > 0, job["dp_noise_multiplier"] > 0
    record = dp and job.get("dp_unit", "device") == "record"
    codec = LAUNCHER_DEFAULTS["codec"]
    at_default = parse_codec(job["codec"]).spec == parse_codec(codec).spec
    changed = []
    if secure and at_default:
        job["codec"] = SECURE_DEFAULT_CODEC
        changed.append(f"codec {SECURE_DEFAULT_CODEC} ({codec} cannot be masked)")
    elif record and at_default:
        job["codec"] = RECORD_DP_CODEC
        changed.append(f"codec {RECORD_DP_CODEC} ({codec} loses DP-SGD's small steps)")
    momentum = LAUNCHER_DEFAULTS["local_momentum"]
    heavy_ball = job.get("momentum_kind", "heavy-ball") == "heavy-ball"
    if record and heavy_ball and job.get("local_momentum") == momentum:
        job["local_momentum"] = 0.0
        changed.append(f"local momentum 0 ({momentum} lengthens the noised steps)")
    if (secure or dp) and job["keyframe_growth"] == LAUNCHER_DEFAULTS["keyframe_growth"]:
        job["keyframe_growth"] = 0.0
        changed.append("error-triggered keyframes off")
    what = "secure aggregation" if secure else "differential privacy"
    return f"{what}: {', '.join(changed)}" if changed else ""
