"""Periodic work, as plain functions; Celery beat entry points wrap them."""

from __future__ import annotations

import logging
from datetime import datetime

from django.utils import timezone

from . import services
from .models import QuotaRequest

logger = logging.getLogger(__name__)


def quota_requests_expire(now: datetime | None = None) -> dict[str, int]:
    """End approved requests whose ``until`` has passed (their extra quota is removed) and close
    pending ones that ended before anyone decided. Each in its own transaction; safe to run twice
    or in two workers at once (compare-and-set on status)."""
    now = now or timezone.now()
    done = {"reverted": 0, "lapsed": 0}
    due = QuotaRequest.objects.filter(until__lte=now)
    for pk in due.filter(status=QuotaRequest.Status.APPROVED).order_by("until", "pk").values_list("pk", flat=True):
        try:
            done["reverted"] += services.quota_request_revert(request_id=pk, now=now)
        except Exception:
            logger.exception("reverting quota request %s failed", pk)
    for pk in due.filter(status=QuotaRequest.Status.PENDING).order_by("until", "pk").values_list("pk", flat=True):
        try:
            done["lapsed"] += services.quota_request_lapse(request_id=pk, now=now)
        except Exception:
            logger.exception("closing quota request %s failed", pk)
    return done
