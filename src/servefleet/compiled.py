"""The simulator's compiled core: its fast path's modules built from the same source by mypyc.

``pip install`` compiles ``MODULES`` with mypyc (``setup.py``) where a C compiler is found,
and ends with the pure-Python package where it is not (docs/simulate.md, "A compiled core").
A compiled module is a ``.so`` next to its ``.py``, and Python imports the ``.so`` first.

Rule: the compiled modules are used all together or not at all. They are used only when the
build finished and wrote its manifest (``_compiled.json``: each module's source SHA-256), every
source still has that hash, and ``SERVEFLEET_PURE_PYTHON`` is unset or empty; otherwise every
module of ``MODULES`` is imported from its ``.py`` (``_FromSource``). Never some of them: the
compiled modules call each other's compiled code directly, so a module edited since the build
and imported from source beside compiled ones would not run where they call it. An edited
source (a developer's editable install) therefore falls back to pure Python, with a warning
that says how to rebuild, instead of running code that is no longer there.

``servefleet/__init__.py`` calls ``select()`` before anything imports a module of the list.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

MODULES = (
    "servefleet.engine.cost_model",
    "servefleet.fastpath.block_pool",
    "servefleet.fastpath.contract",
    "servefleet.fastpath.cruise",
    "servefleet.fastpath.engine",
    "servefleet.fastpath.kv_cache_manager",
    "servefleet.fastpath.private_output",
    "servefleet.fastpath.request",
    "servefleet.fastpath.scheduler",
    "servefleet.routing.load_index",
    "servefleet.sim.cluster",
    "servefleet.sim.frontend",
)
"""The modules mypyc compiles: the fleet simulator's fast path (``servefleet.fastpath``) and its
event loop, the cost model that times each step and the load index that routing asks (what
``benchmarks/sim_speed.py`` spends its time in). The plain engine rule, the workload and the
records stay plain Python. Each must:

* type-check clean under mypy (``--follow-imports=silent --ignore-missing-imports``);
* define no class derived from an abstract base class other than a ``Protocol``: mypyc (2.4.1)
  gives such a class its base's ABC registry, so ``isinstance([], C)`` is True once
  ``isinstance([], Sequence)`` was asked. ``routing.load_index.LoadIndex`` is therefore a
  ``Sequence`` by ``Sequence.register`` and by its methods, not by derivation
  (``tests/test_compiled.py`` checks the list);
* define no class that interpreted code subclasses: why ``routing.base`` is not here
  (``RoutingPolicy``: interpreted policies derive from it and override its class attributes
  ``name`` and ``needs``), nor ``routing.simple``, whose policies derive from it;
* call another module's functions by a name imported from it (``from heapq import
  heappush``): ``heapq.heappush(...)`` looks the attribute up on the module at every call;
* give each frozen dataclass a ``__reduce__`` by ``frozen_reduce``: mypyc's own pickle state
  is set back through the frozen ``__setattr__``, which refuses it.

Compiled, an ``int`` passed where ``int`` is declared must be one (a float raises
``TypeError``), an ``int`` stored where ``float`` is declared becomes a ``float`` (the same
value), and ``sum(<generator>)`` is a loop of ``+``, which mypyc 2.4.1 may type wrongly for
floats: the floats are summed by the builtin over a list (``cost_model.linear_time``)."""


def frozen_reduce(obj: Any) -> tuple[type, tuple[Any, ...]]:
    """``__reduce__`` for a frozen dataclass of a compiled module, or one that writes its own
    ``__init__``: rebuilt by its constructor from its fields. mypyc's own pickle state is set
    back one attribute at a time through ``__setattr__``, which a frozen dataclass refuses
    (``FrozenInstanceError``), on an object made by calling the class with no arguments, which
    an ``__init__`` of its own refuses: without this, ``pickle``, ``copy`` and ``deepcopy``
    fail on the compiled class."""
    return type(obj), tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


MANIFEST = "_compiled.json"
PURE_ENV = "SERVEFLEET_PURE_PYTHON"
PACKAGE_DIR = Path(__file__).resolve().parent


def source_path(module: str, package_dir: Path = PACKAGE_DIR) -> Path:
    """The ``.py`` of a module of ``MODULES``."""
    return package_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _why_pure() -> str | None:
    """Why the modules come from source, or None to use the compiled ones (the rule in the
    module's docstring)."""
    if os.environ.get(PURE_ENV):
        return f"{PURE_ENV} is set"
    try:
        built = json.loads((PACKAGE_DIR / MANIFEST).read_text())
    except FileNotFoundError:
        return "not compiled at install"
    changed = [m for m in MODULES if built.get(m) != source_hash(source_path(m))]
    if changed:
        return f"{source_path(changed[0]).name} changed since it was compiled"
    return None


class _FromSource:
    """Imports the modules of ``MODULES`` from their ``.py``, past any compiled ``.so`` (a
    meta path finder; not derived from ``importlib.abc``'s, whose import costs 25 ms)."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in MODULES:
            return None
        return importlib.util.spec_from_file_location(name, source_path(name))


_UNDECIDED = "undecided"
_why: str | None = _UNDECIDED


def select() -> None:
    """Apply the rule, once per process, before the first import of a module of the list."""
    global _why
    if _why != _UNDECIDED:
        return
    _why = _why_pure()
    if _why is None:
        return
    sys.meta_path.insert(0, _FromSource())
    if _why.endswith("since it was compiled"):
        warnings.warn(
            f"servefleet: the compiled simulator core is out of date ({_why}); it runs as pure "
            f"Python, slower. Rebuild it with `pip install -e .`, or set {PURE_ENV}=1.",
            RuntimeWarning,
            stacklevel=2,
        )


def core() -> str:
    """How the simulator's core runs in this process: ``compiled (mypyc)`` or ``pure Python
    (why)``. Checks that every module of ``MODULES`` is imported the way that says."""
    select()
    compiled = _why is None
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for m in MODULES:
        spec = importlib.util.find_spec(m)
        origin = spec.origin if spec is not None and spec.origin else ""
        if origin.endswith(suffixes) != compiled:
            raise RuntimeError(f"{m} is imported from {origin}, against the rule ({_why})")
    return "compiled (mypyc)" if compiled else f"pure Python ({_why})"
