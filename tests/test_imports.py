"""The package's layering, checked from the source: no new import cycle, no new upward import.

Every import between servefleet modules is read with `ast` (module level and inside functions
alike, since a function-level import is still a dependency). Two rules:

* **No cycles.** The module graph has no strongly connected component of two or more files,
  except those listed in `KNOWN_CYCLES`.
* **Layers.** A module of package P imports only the bottom modules, its own package, and the
  packages in `MAY_IMPORT[P]`; a package's own command module (`P/cli.py`, `P/__main__.py`) also
  those in `CLI_MAY_IMPORT[P]`. Only the top entry points (`servefleet/cli.py`,
  `servefleet/__main__.py`) wire every command together and may import any package. Known breaks are listed in `KNOWN_UPWARD`, each with its reason.

Both lists only shrink: an entry that no longer matches the code fails the test, so a fix must
remove its entry, and a new break must be added here with a reason, in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

# Modules at the bottom: they import only each other (and never a package below).
BOTTOM = {
    "client_protocol",
    "aiohttp_util",
    "compiled",
    "hardware",
    "hardware_tp",
    "models",
    "prefix_hit",
    "protocol",
    "quality",
    "records",
    "stats",
    "stream_stats",
    "telemetry",
    "tokens",
    "yaml_lines",
}

# What each package may import besides the bottom and itself.
MAY_IMPORT: dict[str, set[str]] = {
    "engine": set(),
    "fastpath": {"engine"},
    "workload": set(),
    "routing": {"engine"},
    "gateway": {"routing"},
    "cli_options": {"workload"},
    "report": {"workload"},
    "bench": {"workload", "cli_options"},
    "sim": {"engine", "fastpath", "routing", "workload", "cli_options"},
    # gateway: fleet.yaml's `gateway:` section is the gateway's own configuration model
    "plan": {"engine", "routing", "workload", "sim", "report", "cli_options", "gateway"},
    "fleet": {
        "engine",
        "routing",
        "workload",
        "sim",
        "report",
        "plan",
        "bench",
        "gateway",
        "cli_options",
    },
}

ENTRY_POINTS = {"cli", "__main__"}

# What a package's own command module (`cli.py`, `__main__.py`) may import besides its package's
# MAY_IMPORT: a command renders what it produced.
CLI_MAY_IMPORT: dict[str, set[str]] = {
    "bench": {"report"},
    "report": {"cli_options"},
}

# Import cycles known today, each a set of modules (without the `servefleet.` prefix).
KNOWN_CYCLES: list[frozenset[str]] = []

# Imports that break the layers today: (importer, imported) -> why it is still there.
KNOWN_UPWARD: dict[tuple[str, str], str] = {
    (
        "gateway.cli",
        "fleet.commands",
    ): "`servefleet gateway --config fleet.yaml` builds the gateway's "
    "configuration as `up` does; that builder belongs below fleet/",
    (
        "gateway.cli",
        "plan.fleet_yaml",
    ): "`servefleet gateway --config fleet.yaml` reads the fleet file, whose reader lives in plan/",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "servefleet").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name if name.startswith("servefleet") else None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if (hit := resolve(alias.name)) is not None:
                        targets.add(hit)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    if node.module:
                        base = f"{base}.{node.module}"
                else:
                    base = node.module or ""
                for alias in node.names:
                    hit = resolve(f"{base}.{alias.name}")
                    if hit is None or hit == base.rpartition(".")[0]:
                        hit = resolve(base)
                    if hit is not None:
                        targets.add(hit)
        targets.discard(name)
        graph[name] = targets
    return graph


def _short(module: str) -> str:
    return module.removeprefix("servefleet.").removeprefix("servefleet")


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(_short(m) for m in component))
    return found


def _package(module: str) -> str:
    return _short(module).split(".")[0]


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    breaks = set()
    for importer, targets in graph.items():
        short = _short(importer)
        if short in ENTRY_POINTS or not short:
            continue
        own = _package(importer)
        allowed = MAY_IMPORT.get(own, set())
        if short.split(".")[-1] in ENTRY_POINTS:
            allowed = allowed | CLI_MAY_IMPORT.get(own, set())
        for target in targets:
            other = _package(target)
            if other == own or other in BOTTOM or not other:
                continue
            if own in BOTTOM or other not in allowed:
                breaks.add((short, _short(target)))
    return breaks


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in _graph() if _short(m)} - ENTRY_POINTS
    unplaced = packages - BOTTOM - set(MAY_IMPORT)
    assert not unplaced, f"place these in BOTTOM or MAY_IMPORT: {sorted(unplaced)}"


def test_no_new_import_cycle() -> None:
    cycles = _cycles(_graph())
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not new, f"new import cycles: {new}"
    assert not gone, f"these cycles are gone: remove them from KNOWN_CYCLES: {gone}"


def test_no_new_upward_import() -> None:
    breaks = _upward(_graph())
    new = sorted(breaks - set(KNOWN_UPWARD))
    gone = sorted(set(KNOWN_UPWARD) - breaks)
    assert not new, f"imports against the layers (see MAY_IMPORT): {new}"
    assert not gone, f"these breaks are fixed: remove them from KNOWN_UPWARD: {gone}"


def test_the_check_sees_a_cycle() -> None:
    graph = {
        "servefleet.a": {"servefleet.b"},
        "servefleet.b": {"servefleet.a"},
        "servefleet.c": set(),
    }
    assert _cycles(graph) == [frozenset({"a", "b"})]
