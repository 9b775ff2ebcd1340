"""The compiled simulator core (servefleet/compiled.py, setup.py): used when built, the same
results as pure Python, never used once a source changed since the build."""

from __future__ import annotations

import abc
import importlib
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from servefleet import compiled

TESTS = Path(__file__).parent
COMPILED = compiled._why_pure() is None
needs_compiled = pytest.mark.skipif(not COMPILED, reason=f"core: {compiled.core()}")


def _pure_env() -> dict[str, str]:
    return {**os.environ, compiled.PURE_ENV: "1", "PYTHONPATH": str(TESTS)}


def test_an_install_with_a_c_compiler_runs_the_compiled_core():
    """CI installs with gcc: a build that fell back to pure Python silently would halve the
    simulator's speed, so it fails here."""
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
    edited = tmp_path / "edited" / "servefleet" / "engine" / "cruise.py"
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
