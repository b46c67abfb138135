"""The one module that reads a Prometheus-compatible HTTP API (``settings.PROMETHEUS_URL``): measured GPU use from
NVIDIA's DCGM exporter, as the cluster's Prometheus scraped it (docs/measured-use.md).

It is a data source of its own, next to ``portal/kube.py`` (the only module that talks to clusters' Kubernetes API):
it reads, never writes, and speaks the standard client, ``prometheus-api-client``'s ``PrometheusConnect``. Every
failure (unset URL, connection refused, a 4xx/5xx, a body that is not Prometheus') is one
:class:`PrometheusUnavailable` with a sentence the pages can show; a caller never sees ``requests`` exceptions.
"""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect

TIMEOUT_SECONDS = 10


class PrometheusUnavailable(Exception):
    """Prometheus could not answer (the message says why, for the page)."""


def configured() -> bool:
    return bool(getattr(settings, "PROMETHEUS_URL", ""))


def _client() -> PrometheusConnect:
    url = getattr(settings, "PROMETHEUS_URL", "")
    if not url:
        raise PrometheusUnavailable("No Prometheus is configured (PROMETHEUS_URL): measured use is not available.")
    headers = {"Authorization": f"Bearer {settings.PROMETHEUS_TOKEN}"} if getattr(settings, "PROMETHEUS_TOKEN", "") else None
    return PrometheusConnect(url=url.rstrip("/"), headers=headers, timeout=TIMEOUT_SECONDS)


def query(expr: str, *, at: float | None = None) -> list[tuple[dict[str, str], float]]:
    """An instant query: (labels, value) per series. ``at``: a Unix time (default: Prometheus' now)."""
    params = {"time": repr(float(at))} if at is not None else {}
    try:
        result: Any = _client().custom_query(expr, params=params)
    except PrometheusApiClientException as e:
        raise PrometheusUnavailable(f"Prometheus refused the query: {e}") from None
    except (requests.RequestException, ValueError, KeyError) as e:
        raise PrometheusUnavailable(f"Prometheus did not answer: {type(e).__name__}") from None
    out = []
    for row in result or []:
        try:
            out.append((dict(row.get("metric") or {}), float(row["value"][1])))
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    return out
