"""Builds the simulator's compiled core: the modules ``servefleet.compiled.MODULES`` names,
compiled from their own source by mypyc (docs/simulate.md, "A compiled core").

Where no C compiler works, or with ``SERVEFLEET_PURE_PYTHON=1``, the install ends with the
pure-Python package and the simulator runs the same code, slower; a type error in a compiled
module fails the install (it is a bug, not a missing tool). The manifest that lets the
package use the compiled modules (``_compiled.json``) is written only once all of them built.
Everything else about the package is in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "src" / "servefleet"


def _load_rules():
    """``servefleet/compiled.py`` (standard library only), loaded on its own: the package
    itself is not importable while it is being built."""
    spec = importlib.util.spec_from_file_location("_servefleet_compiled", PACKAGE / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RULES = _load_rules()
MODULES: tuple[str, ...] = RULES.MODULES


def _source(module: str) -> Path:
    return RULES.source_path(module, PACKAGE)


class BuildCore(build_ext):
    """Builds the extensions, each optional; writes the manifest only if all of them built."""

    def run(self) -> None:
        super().run()
        built = [Path(self.get_ext_fullpath(ext.name)) for ext in self.extensions]
        if not self.extensions or not all(p.exists() for p in built):
            print("servefleet: the compiled core did not build; pure Python", file=sys.stderr)
            return
        # <package dir>/engine/block_pool.<suffix> -> <package dir>, in place or in build/lib
        package_dir = Path(self.get_ext_fullpath("servefleet.compiled")).parent
        # what servefleet/compiled.py checks each source against before using the build
        digests = {m: RULES.source_hash(_source(m)) for m in MODULES}
        (package_dir / RULES.MANIFEST).write_text(json.dumps(digests, indent=1) + "\n")


def _extensions() -> list:
    if os.environ.get(RULES.PURE_ENV):
        return []
    if sys.argv[1:2] in (["egg_info"], ["dist_info"]):
        return []  # pip asks for the metadata first, which no extension changes: mypyc's ~10 s
        # of type checking is spent once, on the command that builds
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("servefleet: mypyc is not installed; pure Python", file=sys.stderr)
        return []
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypyc names modules and writes its C from the paths it is given
    try:
        exts = mypycify(
            # the compiled modules must type-check; what they import is read for its types
            # (its own errors are not theirs), and a dependency not installed in the build's
            # environment is Any
            ["--follow-imports=silent", "--ignore-missing-imports"]
            + [str(_source(m).relative_to(ROOT)) for m in MODULES],
            opt_level="3",
            debug_level="0",
            group_name="servefleet_core",
        )
    except SystemExit as e:  # mypyc exits on a type error: a bug in the compiled modules,
        # which must not pass for a working install (it would run them as pure Python)
        raise SystemExit(
            f"servefleet: mypyc found type errors in the compiled modules ({e}; above); fix "
            f"them, or install without the compiled core: {RULES.PURE_ENV}=1 pip install ..."
        ) from None
    except Exception as e:
        print(f"servefleet: mypyc failed ({e}); pure Python", file=sys.stderr)
        return []
    finally:
        os.chdir(cwd)
    for ext in exts:
        ext.optional = True  # a failed build leaves the pure-Python package
    return exts


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildCore})
