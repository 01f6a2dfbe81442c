"""The floor plan's checks: no import circle among the project's modules, no module over
500 lines (with a shrinking allow-list), no private key committed.

The import graph is read from the source with :mod:`ast` (nothing is imported): an edge
``a -> b`` for every ``import b`` / ``from b import x`` in ``a``, wherever it stands
in the module (a function-local import, or one under ``if TYPE_CHECKING:``, is still a
dependency a reader has to follow). ``from pkg import name`` is an edge to ``pkg.name``
when that is a module, else to ``pkg``. Circles are the strongly connected components of that graph
(Tarjan's algorithm).
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("meshfl", "edge_agent", "coordinator", "broker", "models")
APPS = ("edge_agent", "coordinator", "broker", "models")
# The composition root inside the meshfl folder: everything else there is the kernel.
COMPOSITION_ROOT = ("meshfl.app",)
MAX_LINES = 500

# Modules over MAX_LINES today, each with its line count as a ceiling: an entry may only
# go down (lower it when a module shrinks; delete it once the module is under the limit).
OVERSIZE_CEILINGS: dict[str, int] = {}


def _source_files() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.relative_to(ROOT).parts:
                continue
            yield path


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, list[str]]]:
    """Yield ``(target, names)`` for each import statement, absolute or relative."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base]) if base else ".".join(package)
            yield base, [alias.name for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """The project's module graph: module name -> the project modules it imports."""
    files = {_module_name(p): p for p in _source_files()}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for base, names in _imports(tree, name, path.name == "__init__.py"):
            targets = [f"{base}.{n}" for n in names if f"{base}.{n}" in files]
            if len(targets) < len(names) or not names:
                targets.append(base)
            for target in targets:
                # `import a.b.c` where only a.b is ours: the deepest project module.
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_tarjan_finds_a_circle_and_ignores_a_chain() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_circle() -> None:
    circles = strongly_connected(import_graph())
    assert not circles, "import circles (break each one):\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )


def _line_counts() -> dict[str, int]:
    return {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for p in _source_files()
    }


def test_no_module_over_500_lines() -> None:
    counts = _line_counts()
    over = {path: n for path, n in counts.items() if n > OVERSIZE_CEILINGS.get(path, MAX_LINES)}
    assert not over, (
        f"modules over {MAX_LINES} lines (or over their allow-list ceiling); split them: "
        + ", ".join(f"{p} ({n})" for p, n in sorted(over.items()))
    )


def test_oversize_allow_list_has_no_stale_entry() -> None:
    counts = _line_counts()
    stale = {
        path: ceiling
        for path, ceiling in OVERSIZE_CEILINGS.items()
        if counts.get(path, 0) <= MAX_LINES
    }
    assert not stale, (
        "delete these OVERSIZE_CEILINGS entries (the module is under the limit, or moved): "
        + ", ".join(f"{p} (ceiling {c}, now {counts.get(p, 'gone')})" for p, c in stale.items())
    )


def test_no_private_key_is_tracked() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.identity.key", "*.enrolment.json", "meshfl-agent/*"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not tracked, f"agent output is committed; git rm it: {tracked}"


def test_only_the_mqtt_transport_imports_paho() -> None:
    # lint-imports checks this too; this names the offending line in a plain test run.
    offenders = []
    for path in _source_files():
        name = _module_name(path)
        if name.startswith("edge_agent.transport."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for base, _names in _imports(tree, name, path.name == "__init__.py"):
            if base == "paho" or base.startswith("paho."):
                offenders.append(f"{path.relative_to(ROOT)} imports {base}")
    assert not offenders, "paho outside edge_agent/transport: " + "; ".join(offenders)


def test_each_typer_app_has_its_own_name() -> None:
    # Two `topology_app`s (meshfl topology, meshfl fleet topology) read as one in a grep.
    owners: dict[str, list[str]] = {}
    for path in _source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "typer.Typer"
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        owners.setdefault(target.id, []).append(_module_name(path))
    shared = {name: mods for name, mods in owners.items() if len(mods) > 1}
    assert not shared, f"Typer apps sharing a name (rename one): {shared}"


def test_each_probe_module_says_what_it_probes() -> None:
    vague = [
        str(p.relative_to(ROOT))
        for p in _source_files()
        if p.stem.strip("_") in ("probe", "netprobe")
    ]
    assert not vague, f"name what these probe (capability_probe, link_probe, ...): {vague}"


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_kernel_imports_no_app_and_no_composition_root() -> None:
    # import-linter cannot say "meshfl minus meshfl.app is the bottom layer" (a layer may
    # not contain another); this checks it for every kernel module, new ones included.
    # meshfl.__main__ (python -m meshfl) is the one kernel module that starts the CLI.
    graph = import_graph()
    offenders = [
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _within(module, ("meshfl",))
        and not _within(module, COMPOSITION_ROOT)
        and module != "meshfl.__main__"
        for target in sorted(targets)
        if _within(target, APPS + COMPOSITION_ROOT)
    ]
    assert not offenders, "the kernel imports above itself: " + "; ".join(offenders)


def test_the_agent_output_folder_is_named_once() -> None:
    # edge_agent.config.DEFAULT_OUT; the CLI's --out defaults read it.
    places = [
        str(p.relative_to(ROOT))
        for p in _source_files()
        if '"meshfl-agent"' in p.read_text(encoding="utf-8")
    ]
    assert places == ["edge_agent/config.py"], places
