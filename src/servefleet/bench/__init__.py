"""The live benchmark: a load generator for OpenAI-compatible servers.

When to send (``schedule``: a workload source's absolute schedule, ``StopRule``), how to send
(``client``: aiohttp, keep-alive, a timestamp at every SSE event) and what a run is (``point``,
``runs``: one point, sweeps, SLO search) are separate pieces; ``selfcheck`` says whether the
client kept up, ``scrape`` reads the server's /metrics. Records: ``servefleet.records``;
metrics: ``servefleet.stats``; reports: ``servefleet.report``.
"""
