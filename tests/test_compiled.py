"""The compiled simulator core (servefleet/compiled.py, setup.py): used when built, the same
results as pure Python, never used once a source changed since the build."""

from __future__ import annotations

import abc
import copy
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import pickle
import shutil
import subprocess
import sys
import typing
from collections.abc import Container, Sequence
from pathlib import Path

import pytest

from servefleet import compiled
from servefleet.records import RequestRecord
from servefleet.routing import LoadIndex, ReplicaView
from servefleet.workload.types import Load, RequestSpec, Segment

TESTS = Path(__file__).parent
COMPILED = compiled._why_pure() is None
needs_compiled = pytest.mark.skipif(not COMPILED, reason=f"core: {compiled.core()}")


def _pure_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, compiled.PURE_ENV: "1", "PYTHONPATH": path}


def test_an_install_with_a_c_compiler_runs_the_compiled_core():
    """CI installs with gcc: a build that fell back to pure Python silently would halve the
    simulator's speed, so it fails here (not in a run that asks for pure Python)."""
    if os.environ.get(compiled.PURE_ENV):
        pytest.skip(f"{compiled.PURE_ENV} is set: pure Python asked for")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the install is pure Python by design")
    core = compiled.core()
    assert core == "compiled (mypyc)", f"{core}: rebuild with `pip install -e .`"


def test_no_compiled_class_derives_from_an_abstract_base_class():
    """mypyc gives such a class its base's ABC registry (compiled.MODULES' docstring)."""
    for name in compiled.MODULES:
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or typing.Protocol in cls.__mro__:
                continue
            assert not isinstance(cls, abc.ABCMeta), f"{name}.{cls_name} derives from an ABC"


def test_the_load_index_is_a_sequence_without_deriving_from_one():
    """``LoadIndex`` is compiled, so it is a ``Sequence`` by registration and by the methods
    ``Sequence`` would mix in (compiled.MODULES' docstring), over the members of a subset."""
    views = [ReplicaView("a"), ReplicaView("b", ready=False), ReplicaView("c")]
    idx = LoadIndex(views)
    sub = idx.subset({0, 1})
    assert isinstance(idx, Sequence) and isinstance(sub, Sequence)
    assert not isinstance([], LoadIndex) and not isinstance(views, LoadIndex)
    assert isinstance(idx.available_names, Container) and "a" in idx.available_names
    assert len(sub) == 2 and list(sub) == views[:2] and sub[-1] is views[1]
    assert sub[0:1] == views[:1] and list(reversed(sub)) == views[1::-1]
    assert views[1] in sub and views[2] not in sub
    assert sub.index(views[1]) == 1 and sub.count(views[0]) == 1
    with pytest.raises(ValueError):
        sub.index(views[2])


def test_the_compiled_dataclasses_pickle_and_copy():
    """mypyc sets a compiled object's pickle state back through ``__setattr__``, which a
    frozen dataclass refuses: each frozen one has a ``__reduce__`` (``compiled.frozen_reduce``).
    Worker processes (the planner, sweeps) get them pickled."""
    for name in compiled.MODULES:
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not dataclasses.is_dataclass(cls):
                continue
            if cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
                assert "__reduce__" in vars(cls), f"{name}.{cls_name} cannot be pickled"
    seg = Segment("sys:p:0", 12, "system")
    objs = [
        seg,
        Load(rate=2.5),
        Load(concurrency=8),
        RequestSpec("r000001", "chat", (seg, Segment("u:r000001", 30)), 100, 0.25, "s-1"),
        RequestRecord("r000001", "chat", 0.25, 0.25, 0.5, 1.5, [0.5, 1.5], [1, 1], 42, 2),
    ]
    for obj in objs:
        for again in (lambda o: pickle.loads(pickle.dumps(o)), copy.copy, copy.deepcopy):
            back = again(obj)
            assert type(back) is type(obj) and back == obj


def test_pure_python_gives_the_same_results_as_the_compiled_core():
    """The golden digests (tests/test_sim_golden.py, run here by whichever core is installed)
    from the pure-Python modules too."""
    names = ["overload-preempts", "h200-7b-shared-gpu-no-caching"]
    code = (
        "import json, sys, test_sim_golden as g; from servefleet import compiled; "
        "print(json.dumps([compiled.core(), {n: g.run_digest(n) for n in sys.argv[1:]}]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *names],
        env=_pure_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    core, digests = json.loads(out.stdout)
    assert core == f"pure Python ({compiled.PURE_ENV} is set)"
    from test_sim_golden import GOLDEN

    assert digests == {n: GOLDEN[n] for n in names}


@needs_compiled
def test_a_source_changed_since_the_build_turns_the_whole_core_to_pure_python(tmp_path):
    """A copy of the installed package, one compiled module's source edited: every module of
    the list comes from its .py, with a warning that says how to rebuild; the unedited copy
    runs compiled."""
    runtime = importlib.util.find_spec("servefleet_core__mypyc")
    assert runtime is not None and runtime.origin
    for name in ("fresh", "edited"):
        root = tmp_path / name
        shutil.copytree(compiled.PACKAGE_DIR, root / "servefleet", ignore=_no_bytecode)
        shutil.copy(runtime.origin, root)
    edited = tmp_path / "edited" / "servefleet" / "fastpath" / "cruise.py"
    edited.write_text(edited.read_text() + "\n# edited after the build\n")
    code = (
        "import importlib, json; from servefleet import compiled; "
        "print(json.dumps([compiled.core(), "
        "[importlib.import_module(m).__file__ for m in compiled.MODULES]]))"
    )
    seen = {}
    for name in ("fresh", "edited"):
        env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
        env["PYTHONPATH"] = str(tmp_path / name)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        seen[name] = (*json.loads(out.stdout), out.stderr)
    core, files, stderr = seen["fresh"]
    assert core == "compiled (mypyc)" and not stderr
    assert all(f.startswith(str(tmp_path / "fresh")) and f.endswith(".so") for f in files)
    core, files, stderr = seen["edited"]
    assert core == "pure Python (cruise.py changed since it was compiled)"
    assert all(f.startswith(str(tmp_path / "edited")) and f.endswith(".py") for f in files)
    assert "out of date" in stderr and "pip install -e ." in stderr


def _no_bytecode(_dir: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__"]
