"""Fixtures shared by the quota tests: a fleet (cluster, flavors, nodes) and a quota split over it."""

from __future__ import annotations

import pytest

from quotas import services

from .factories import GPU, make_fleet


@pytest.fixture
def fleet(cast):
    return make_fleet()


@pytest.fixture
def split(cast, fleet):
    """acme 8 of the 16 H100s, vision 4 of acme's 8; globex 4, llm 2."""
    ops = cast.actor("ops")
    services.quota_set(actor=ops, tenant=cast.acme, flavor=fleet.h100, resource=GPU, nominal=8)
    services.quota_set(actor=ops, tenant=cast.globex, flavor=fleet.h100, resource=GPU, nominal=4)
    services.quota_set(actor=ops, project=cast.vision, flavor=fleet.h100, resource=GPU, nominal=4)
    services.quota_set(actor=ops, project=cast.llm, flavor=fleet.h100, resource=GPU, nominal=2)
    return fleet
