"""Domain errors of capacity, flavors and quotas. ``portal.api.exception_handler`` maps them to HTTP."""

from __future__ import annotations

from decimal import Decimal

from portal.exceptions import ConflictError


class QuotaExceeded(ConflictError):
    """A change would break a quota invariant; the message names the constraint and by how much.

    ``constraint`` is ``"tenant"`` (the projects' quotas must fit in their tenant's), ``"projects"``
    (a tenant's quota cannot go below what its projects are promised) or ``"cluster"`` (the tenants'
    quotas must fit in the capacity plus the allowed overcommit). ``over`` is the excess.
    """

    code = "quota_exceeded"

    def __init__(self, message: str, *, constraint: str, over: Decimal):
        super().__init__(message)
        self.constraint = constraint
        self.over = over


class AlreadyDecided(ConflictError):
    """Compare-and-set lost: the quota request is no longer in the state the caller saw."""

    code = "already_decided"


class PlanChanged(ConflictError):
    """The plan made now differs from the one the person reviewed (its fingerprint); nothing is applied."""

    code = "plan_changed"


class NothingToApply(ConflictError):
    """The cluster already matches the desired state of its current architecture."""

    code = "nothing_to_apply"
