"""A tiny stand-in for the Kubernetes API server: the one route the gateway's discovery reads.

    python tests/fake_k8s_api.py SLICES.json TOKEN

``GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=
kubernetes.io/service-name=NAME`` answers the EndpointSliceList in SLICES.json (re-read at every
request, so a test changes the cluster by rewriting the file), keeping the items of that
namespace and Service; 401 without ``Authorization: Bearer TOKEN``, 400 without the selector.
Prints ``fake-k8s-api ready: port=N`` once it listens on 127.0.0.1 (a free port)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from aiohttp import web


def make_app(slices: Path, token: str) -> web.Application:
    async def endpointslices(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {token}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        key, _, service = request.query.get("labelSelector", "").partition("=")
        if key != "kubernetes.io/service-name" or not service:
            return web.json_response({"kind": "Status", "code": 400}, status=400)
        data = json.loads(slices.read_text())
        ns = request.match_info["ns"]
        data["items"] = [
            s
            for s in data["items"]
            if s["metadata"]["namespace"] == ns
            and s["metadata"]["labels"].get("kubernetes.io/service-name") == service
        ]
        return web.json_response(data)

    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", endpointslices)
    return app


async def main(slices: Path, token: str) -> None:
    import asyncio

    runner = web.AppRunner(make_app(slices, token))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"fake-k8s-api ready: port={runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    import asyncio

    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
