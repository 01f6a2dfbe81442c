"""The REST contract as a package of one module per resource (issue 21, item 4).

Every shape is defined once in its resource module, re-exported by ``meshfl.contract``
(importers write ``from meshfl.contract import JobSpec``), and marked for pydantic by an
explicit decorator on its definition: no import-time rewriting of the module's globals.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pydantic
import pytest
from typing_extensions import is_typeddict

import meshfl.contract as contract

RESOURCE_MODULES = sorted(
    name
    for _, name, _ in pkgutil.iter_modules(contract.__path__, "meshfl.contract.")
    if not name.rsplit(".", 1)[1].startswith("_")
)

# Request bodies and their parts: unknown fields are a 422 (a misspelt option is refused).
REQUEST_BODIES = {
    "ApiTokenCreate",
    "CustomGraph",
    "Declaration",
    "DeviceDecline",
    "DeviceDone",
    "DevicePatch",
    "DeviceSelector",
    "EnrolRequest",
    "EnrolmentTokenCreate",
    "FleetEnrolmentRotate",
    "JobSpec",
    "KeyBundle",
    "ModelSpec",
    "PrivacySpend",
    "RoundLedger",
    "RoundMetrics",
    "TopologySetting",
}


def _shapes() -> dict[str, type]:
    shapes: dict[str, type] = {}
    for module_name in RESOURCE_MODULES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if is_typeddict(value) and value.__module__ == module_name:
                assert name not in shapes, f"{name} defined twice"
                shapes[name] = value
    return shapes


def test_the_contract_is_split_by_resource() -> None:
    short = {name.rsplit(".", 1)[1] for name in RESOURCE_MODULES}
    assert {"devices", "jobs", "topology", "ledger", "secagg", "privacy", "tokens"} <= short
    assert contract.JobSpec.__module__ == "meshfl.contract.jobs"
    assert len(_shapes()) == 54


def test_every_public_name_is_re_exported_from_the_package() -> None:
    for module_name in RESOURCE_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            assert name in contract.__all__, f"{module_name}.{name} not in meshfl.contract"
            assert getattr(contract, name) is getattr(module, name)
    assert sorted(contract.__all__) == sorted(set(contract.__all__))


def test_every_shape_is_strict_and_request_bodies_refuse_unknown_fields() -> None:
    shapes = _shapes()
    assert shapes.keys() >= REQUEST_BODIES
    for name, shape in shapes.items():
        expected: dict[str, object] = {"strict": True}
        if name in REQUEST_BODIES:
            expected["extra"] = "forbid"
        assert shape.__pydantic_config__ == expected, name  # type: ignore[attr-defined]


def test_no_module_rewrites_its_globals_at_import() -> None:
    for path in Path(contract.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "globals", f"{path.name} calls globals()"


@pytest.mark.parametrize("name", ["JobSpec", "Assignment", "JobPublic", "RoundMetrics"])
def test_pydantic_resolves_cross_module_references(name: str) -> None:
    schema = pydantic.TypeAdapter(getattr(contract, name)).json_schema()
    assert schema["type"] == "object"
    if name == "JobSpec":
        assert schema["additionalProperties"] is False
        assert "ModelSpec" in schema["$defs"] and "CustomGraph" in schema["$defs"]
