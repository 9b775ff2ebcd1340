"""Rules the package's source keeps, checked on its syntax tree."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "servefleet"


def test_no_asyncio_wait_for():
    """``asyncio.timeout`` bounds waits, never ``asyncio.wait_for``: on Python 3.11,
    ``wait_for`` returns the awaited result instead of raising when a cancellation arrives
    just as that result does, so a loop that is cancelled to stop (the gateway's health
    checks and scrapes) may go on for ever and its process never exits."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "wait_for"
                and isinstance(node.value, ast.Name)
                and node.value.id == "asyncio"
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, f"asyncio.wait_for in {found}: use 'async with asyncio.timeout(...)'"
