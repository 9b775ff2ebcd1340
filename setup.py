"""Builds the simulator's compiled core: the modules ``servefleet.compiled.MODULES`` names,
compiled from their own source by mypyc (docs/simulate.md, "A compiled core").

Where no C compiler works, or with ``SERVEFLEET_PURE_PYTHON=1``, the install ends with the
pure-Python package and the simulator runs the same code, slower. The manifest that lets the
package use the compiled modules (``_compiled.json``) is written only once all of them built.
Everything else about the package is in ``pyproject.toml``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "src" / "servefleet"


def _compiled_modules() -> tuple[str, ...]:
    """``MODULES`` from ``servefleet/compiled.py``, read without importing the package."""
    tree = ast.parse((PACKAGE / "compiled.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODULES":
            return ast.literal_eval(node.value)
    raise RuntimeError("servefleet/compiled.py defines no MODULES")


MODULES = _compiled_modules()


def _source(module: str) -> Path:
    return PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")


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
        digests = {m: hashlib.sha256(_source(m).read_bytes()).hexdigest() for m in MODULES}
        (package_dir / "_compiled.json").write_text(json.dumps(digests, indent=1) + "\n")


def _extensions() -> list:
    if os.environ.get("SERVEFLEET_PURE_PYTHON"):
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
    except (Exception, SystemExit) as e:  # mypyc exits on a type error
        print(f"servefleet: mypyc failed ({e}); pure Python", file=sys.stderr)
        return []
    finally:
        os.chdir(cwd)
    for ext in exts:
        ext.optional = True  # a failed build leaves the pure-Python package
    return exts


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildCore})
