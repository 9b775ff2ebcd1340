"""``servefleet up``: start a fleet (fleet.yaml) as processes, supervise it, export it."""
