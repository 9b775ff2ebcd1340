"""Exporters: the same fleet as an nginx.conf, a docker-compose file, Kubernetes manifests
(one module each: export_nginx, export_compose, export_k8s; docs/export.md)."""

from __future__ import annotations

from .export_compose import compose
from .export_k8s import k8s
from .export_nginx import nginx_conf

__all__ = ["compose", "k8s", "nginx_conf"]
