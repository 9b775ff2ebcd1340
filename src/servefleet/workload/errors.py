"""The one exception the workload package raises for bad input."""

from __future__ import annotations


class WorkloadError(ValueError):
    """A workload file, preset, dataset or override is wrong; the message names what and how to fix it."""
