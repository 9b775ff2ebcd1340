"""servefleet: plan, simulate, up, gateway, bench, report (docs/design.md)."""

from servefleet.compiled import select as _select_core

_select_core()  # before any module of the compiled core is imported (servefleet/compiled.py)
