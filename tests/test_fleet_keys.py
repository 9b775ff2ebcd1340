"""API keys under `servefleet up`: fleet.yaml's `gateway:` names a keys file and the limits of
each tier; the fleet it starts verifies the keys and limits each key in its own bucket (the
official `openai` client against a real `up` of sim-server replicas)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import yaml

from servefleet.fleet.commands import free_ports
from servefleet.gateway.identity import key_hash
from servefleet.plan.fleet_yaml import dump_fleet
from test_fleet import Up, kill_up, make_fleet, spawn_up

KEYS = {"alice-key-1": ("alice", "free"), "bob-key-2": ("bob", "pro")}
# refills slowly (one request per 100 s): what a test of a few seconds sees is the burst
TIERS = {
    "free": {"requests_per_second": 0.01, "request_burst": 2},
    "pro": {"requests_per_second": 0.01, "request_burst": 5},
}


def _ask(client: openai.OpenAI) -> None:
    client.completions.create(model="Qwen2.5-7B", prompt="hello", max_tokens=2)


def test_two_keys_of_two_tiers_are_limited_each_on_its_own(tmp_path: Path) -> None:
    keys = [{"name": n, "sha256": key_hash(k), "tier": t} for k, (n, t) in KEYS.items()]
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump({"keys": keys}))
    ports = free_ports(3)
    fleet = make_fleet(
        ports,
        gateway={  # replaces make_fleet's gateway: its port too
            "host": "127.0.0.1",
            "port": ports[-1],
            "auth": {"keys_file": "keys.yaml", "required": True},  # relative to fleet.yaml
            "rate_limit": {"requests_per_second": 0.01, "request_burst": 1, "tiers": TIERS},
        },
    )
    port = fleet.gateway.port
    (tmp_path / "fleet.yaml").write_text(dump_fleet(fleet))
    state = tmp_path / "state"
    proc = spawn_up(tmp_path / "fleet.yaml", state)
    try:
        Up(proc, state).expect("fleet up:")
        assert (state / "gateway.yaml").stat().st_mode & 0o777 == 0o600  # readable by its user

        def client(key: str) -> openai.OpenAI:
            return openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=30
            )

        alice, bob = client("alice-key-1"), client("bob-key-2")
        # alice's tier lets 2 through at once; the third is hers to wait for
        _ask(alice)
        _ask(alice)
        with pytest.raises(openai.RateLimitError) as limited:
            _ask(alice)
        assert "key:alice" in str(limited.value)
        # bob, from the same address, is not held by alice's bucket, and his tier holds 5
        for _ in range(5):
            _ask(bob)
        with pytest.raises(openai.RateLimitError) as limited:
            _ask(bob)
        assert "key:bob" in str(limited.value)
        # a key that is not in the keys file gets no service at all (auth.required)
        with pytest.raises(openai.AuthenticationError):
            _ask(client("invented-key"))
    finally:
        kill_up(proc, state)
