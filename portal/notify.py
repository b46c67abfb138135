"""Telling people what happened: email through Django's mail settings, plus an optional JSON webhook
(``settings.PORTAL_WEBHOOK_URL``, empty by default).

The one notifier of the portal. Apps decide who and what (``quotas/notify.py``, ``workloads/notify.py``)
and call :func:`notify_send`, usually after commit (``portal.events.after_commit``), so a rolled-back
change tells nobody and a slow mail server or webhook never holds a row lock. Every address gets its own
message (nobody sees the others' addresses). Failures are logged, never raised: the change itself has
been committed.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.serializers.json import DjangoJSONEncoder

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_SECONDS = 3.0


SUBJECT_PREFIX = "[GPU portal]"


def portal_link(path: str) -> str:
    """An absolute link to one of the portal's pages (``path`` starts with ``/``), for emails, which no mail
    client can open relative to anything: ``PORTAL_BASE_URL``, else the address ``make run`` prints."""
    if "://" in path:
        return path
    base = str(getattr(settings, "PORTAL_BASE_URL", "") or getattr(settings, "PORTAL_LINK_BASE_URL", "")).rstrip("/")
    return base + "/" + path.lstrip("/")


def notify_send(*, subject: str, body: str, to: Iterable[str], payload: dict[str, Any] | None = None,
                topic: str = "portal") -> bool:
    """Email ``body`` to each address in ``to`` (one message each), then POST ``payload`` (when given) to
    the webhook. ``topic`` names the notification in the logs ("quota webhook to ... failed").
    Every subject starts with ``[GPU portal]`` (added where the caller left it out), so mail filters can sort.
    True when every email went out (or there was nobody to email)."""
    if not subject.startswith(SUBJECT_PREFIX):
        subject = f"{SUBJECT_PREFIX} {subject}"
    sent = True
    addresses = [address for address in to if address]
    if addresses:
        try:
            messages = [EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, [address]) for address in addresses]
            get_connection().send_messages(messages)
        except Exception:
            logger.exception("%s notification email failed: %s", topic, subject)
            sent = False
    if payload is not None:
        webhook_post(payload, topic=topic)
    return sent


def webhook_post(payload: dict[str, Any], *, topic: str = "portal") -> bool:
    """POST ``payload`` as JSON to ``PORTAL_WEBHOOK_URL`` (when set). True when the hook answered 2xx."""
    url = str(getattr(settings, "PORTAL_WEBHOOK_URL", "") or "")
    if not url:
        return False
    if urlsplit(url).scheme not in ("http", "https"):
        logger.error("PORTAL_WEBHOOK_URL must be an http(s) URL; not posting to %r", url)
        return False
    data = json.dumps(payload, cls=DjangoJSONEncoder).encode("utf-8")
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json", "User-Agent": "gpu-portal"}
    )
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_SECONDS) as response:
            return 200 <= response.status < 300
    except Exception as exc:
        logger.warning("%s webhook to %s failed: %s", topic, urlsplit(url).netloc, exc)
        return False
