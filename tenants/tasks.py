"""Celery entry points for tenancy. Thin: call one service.

Beat schedule (portal/settings.py): ``tenants.invitations_expire`` hourly. Running it twice is
harmless: each overdue invitation moves once (a compare-and-set in ``tenants/invitation_states.py``).
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="tenants.invitations_expire")
def invitations_expire_task() -> int:
    from .services import invitations_expire_overdue

    return invitations_expire_overdue()
