"""A job's options are defined once (issue 21, item 4): both commands and the launcher's
config are derived from :data:`meshfl.contract.JOB_OPTIONS`."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated

import click
import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from meshfl.app.cli.job import job_app
from meshfl.app.cli.local import local
from meshfl.app.cli.option_group import option_group
from meshfl.app.local.config import LocalConfig
from meshfl.contract import (
    JOB_DEFAULTS,
    JOB_OPTIONS,
    LAUNCHER_DEFAULTS,
    LAUNCHER_OVERRIDES,
    JobSpec,
    check_job_options,
    job_spec_fields,
    spec_value,
)
from meshfl.errors import ConfigError


def _local_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(local)
    return app


COMMANDS = {
    "job start": lambda: typing.cast(click.Group, get_command(job_app)).commands["start"],
    "local": lambda: get_command(_local_app()),
}
HELP = {
    "job start": lambda: (job_app, ["start", "--help"]),
    "local": lambda: (_local_app(), ["--help"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_job_option_is_an_option_of_both_commands_with_the_launcher_default(
    command: str,
) -> None:
    params = {p.name: p for p in COMMANDS[command]().params}

    for option in JOB_OPTIONS:
        param = params.get(option.name)
        if not option.command_line:
            assert param is None, option.field
            continue
        assert param is not None, f"{command} has no {option.flag}"
        assert param.opts[0] == option.flag
        assert param.default == LAUNCHER_DEFAULTS[option.field], option.field
        assert typing.cast(click.Option, param).help == option.help


@pytest.mark.parametrize("command", sorted(HELP))
def test_both_helps_list_every_job_option(command: str) -> None:
    app, argv = HELP[command]()
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "300"})

    assert result.exit_code == 0, result.output
    for option in JOB_OPTIONS:
        assert (option.flag in result.output) == option.command_line, option.flag


def test_the_launcher_config_takes_every_job_option_with_its_default() -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(LocalConfig)}

    assert {o.field: defaults[o.field] for o in JOB_OPTIONS} == dict(LAUNCHER_DEFAULTS)
    assert LocalConfig().job_options() == dict(LAUNCHER_DEFAULTS)


def test_the_launcher_departs_from_a_bare_rest_job_only_where_its_overrides_say() -> None:
    differ = {k for k, v in LAUNCHER_DEFAULTS.items() if JOB_DEFAULTS[k] != v}

    assert differ == set(LAUNCHER_OVERRIDES) == {"topology", "keyframe_growth", "local_momentum"}


def test_every_job_option_is_a_jobspec_field_required_exactly_when_the_table_says() -> None:
    annotations = JobSpec.__annotations__

    for option in JOB_OPTIONS:
        assert option.field in annotations, option.field
        optional = "NotRequired" in str(annotations[option.field])
        assert option.required is not optional, option.field


def test_a_spec_carries_the_required_fields_and_the_options_that_differ() -> None:
    values = {**JOB_DEFAULTS, "mode": "async", "topology": "ring"}

    fields = job_spec_fields(values)

    required = {o.field for o in JOB_OPTIONS if o.required}
    assert set(fields) == required | {"mode", "topology"}
    assert (fields["mode"], fields["topology"]) == ("async", "ring")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rounds", 0, "--rounds must be at least 1 (got 0)"),
        ("round_deadline_s", float("nan"), "--deadline must be a positive number (got nan)"),
        ("algorithm", "sgd", "--algorithm must be choco or dpsgd (got 'sgd')"),
        ("uplink_budget_s", 0.0, "--uplink-budget must be > 0 seconds (got 0.0)"),
        ("topology_seed", 2**32, "--topology-seed must be in [0, 2^32)"),
        ("keyframe_growth", 0.5, "--keyframe-growth must be 0 (off) or > 1"),
    ],
)
def test_an_out_of_range_option_is_refused_in_one_line_naming_its_flag(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_job_options({**LAUNCHER_DEFAULTS, field: value})

    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_the_defaults_pass_their_own_checks() -> None:
    check_job_options(LAUNCHER_DEFAULTS)
    check_job_options(JOB_DEFAULTS)


def test_an_app_reads_a_field_the_spec_leaves_out_as_its_default() -> None:
    assert spec_value({"mode": "async"}, "mode") == "async"
    assert spec_value({}, "staleness") == JOB_DEFAULTS["staleness"] == 2


def test_an_option_group_gives_a_command_its_options_as_one_value() -> None:
    def build(
        width: Annotated[int, typer.Option(help="Width.")] = 3,
        tall: Annotated[bool, typer.Option(help="Tall.")] = False,
    ) -> tuple[int, bool]:
        return width, tall

    seen: list[object] = []

    @option_group(build, into="shape")
    def command(name: str, shape: tuple[int, bool]) -> None:
        seen.append((name, shape))

    app = typer.Typer()
    app.command()(command)

    result = CliRunner().invoke(app, ["box", "--width", "5", "--tall"])

    assert result.exit_code == 0, result.output
    assert seen == [("box", (5, True))]


def test_meshfl_local_help_loses_nothing_in_80_columns() -> None:
    # Rich crops a word wider than its column with "…": an off-by-default switch is one
    # flag (no --no-plan column) and no metavar or example is wider than the help column.
    result = CliRunner().invoke(_local_app(), ["--help"], terminal_width=80)

    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "…" not in result.output
    assert "--no-plan" not in result.output and "--plan " in result.output
