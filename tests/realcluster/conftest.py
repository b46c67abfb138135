"""The parity suite's cluster: each scenario once on the sandbox and once on the real control plane."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(params=["sandbox", "real"])
def cluster_under_test(request) -> Any:
    """A fresh sandbox, or the session's real control plane (its portal-owned objects left by an earlier test
    are removed by the reconcile of the new Cluster row, as they would be after an architecture change)."""
    if request.param == "sandbox":
        return request.getfixturevalue("fresh_sandbox")
    return request.getfixturevalue("real_cluster")
