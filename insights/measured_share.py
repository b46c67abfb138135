"""A tenant's measured idle share over a period, for its statement (docs/measured-use.md, "On statements"):
information next to the charges, which stay allocation-based. Answers the ``measured_idle_share`` extension slot
(billing may not import insights)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import F, FloatField, Q, Sum
from django.db.models.functions import Cast

from .common import hours, ratio
from .measured import idle_percent
from .models import MeasuredSample


def idle_share(tenant: Any, start: datetime, end: datetime) -> dict[str, Any] | None:
    """Measured idle and allocated GPU-hours of ``tenant``'s samples whose slot ended in ``(start, end]`` and the idle
    share of allocated (%); None without samples. One grouped sum over the ``(at, tenant)`` index."""
    weight = Cast(F("gpus") * F("seconds"), FloatField())
    got = MeasuredSample.objects.filter(tenant_id=tenant.pk, at__gt=start, at__lte=end).aggregate(
        alloc=Sum(weight), idle=Sum(weight, filter=Q(util_avg__lt=idle_percent())))
    if not got["alloc"]:
        return None
    return {"idle_gpu_hours": hours((got["idle"] or 0) / 3600), "allocated_gpu_hours": hours(got["alloc"] / 3600),
            "share": ratio(got["idle"] or 0, got["alloc"]), "threshold": idle_percent()}
