"""`python -m servefleet …` runs the `servefleet` command (where its script is not installed)."""

from servefleet.cli import main

main()
