# syntax=docker/dockerfile:1
# The servefleet image: the gateway (and sim-server replicas) that `servefleet export compose`
# and `servefleet export k8s` run. Build it from the repository's root:
#
#   docker build -t servefleet:0.1.0 .        # the tag the exports name (the package version)
#
# Stage 1 builds servefleet's wheel from this source tree, with the wheels of its dependencies
# (the `redis` extra: rate limits shared by several gateways); stage 2 installs only those
# wheels (no network, no compiler) on a slim Python and runs as a non-root user. setup.py is
# left out: it compiles the simulator's core (servefleet/compiled.py) for speed, which the
# image's sim-server replicas, paced by their clock, do not need; the wheel is pure Python.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[redis]" \
    && find /wheels -name "*.whl" > /wheels/requirements.txt

FROM python:${PYTHON_VERSION}-slim
COPY --from=wheels /wheels /wheels
# exactly the wheels of stage 1 (their paths pin them), nothing from an index
RUN pip install --no-cache-dir --no-index --requirement /wheels/requirements.txt \
    && rm -rf /wheels \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin servefleet
# numeric, so that Kubernetes can check runAsNonRoot
USER 10001
WORKDIR /home/servefleet
ENV PYTHONUNBUFFERED=1
EXPOSE 8000
CMD ["servefleet", "--help"]
