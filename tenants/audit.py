"""Writing the audit log. Services call ``audit_record`` inside their transaction."""

from __future__ import annotations

from typing import Any

from django.db import models

from .access import Actor
from .models import AuditEntry, Project, Tenant


def snapshot(obj: models.Model | None, fields: list[str]) -> dict[str, Any] | None:
    """A small before/after summary of ``obj``: the named fields, as JSON-friendly values."""
    if obj is None:
        return None
    out: dict[str, Any] = {}
    for name in fields:
        value = getattr(obj, name)
        if isinstance(value, models.Model):
            value = str(value)
        elif hasattr(value, "isoformat"):
            value = value.isoformat()
        out[name] = value
    return out


def audit_record(
    *,
    actor: Actor,
    action: str,
    target: models.Model,
    tenant: Tenant | None = None,
    project: Project | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEntry:
    user = actor.user if actor.user is not None and actor.user.is_authenticated else None
    return AuditEntry.objects.create(
        actor=user,
        token=actor.token,
        actor_label=actor.label[:200],
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        target_repr=str(target)[:200],
        tenant=tenant,
        project=project,
        before=before,
        after=after,
        client_address=actor.ip,
    )
