"""pytest support for the real control plane: one per test session (per xdist worker that asks for it).

``real_cluster`` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, Kueue and kwok with the demo
profile's nodes, and stops them at the end. Without the built binaries (``make cluster-build``) the tests that
ask for it are skipped on a laptop and fail in CI (``PORTAL_REQUIRE_SERVICES=1``), where ``.ci/run`` builds first.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import controlplane


@dataclass
class RealCluster:
    """What the cluster tests need of a cluster, as ``sandbox.app.Sandbox`` offers it: a kubeconfig, and a clock
    (real time here: ``advance`` waits a little instead of moving simulated time)."""

    cp: controlplane.ControlPlane
    kind: str = "real"

    @property
    def kubeconfig(self) -> Path:
        return self.cp.kubeconfig

    def advance(self, seconds: float) -> None:
        time.sleep(min(float(seconds), 1.0) if seconds else 0)

    def logs(self, name: str) -> str:
        return (self.cp.state_dir / "logs" / f"{name}.log").read_text(errors="replace")


def built() -> bool:
    return not [n for n in [*controlplane.BINARIES, "kwok"] if not (controlplane.BIN / n).exists()]


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory):
    if not built():
        if os.environ.get("PORTAL_REQUIRE_SERVICES") == "1":
            pytest.fail("the real control plane is not built (make cluster-build); CI builds it before the tests")
        pytest.skip("the real control plane is not built (make cluster-build)")
    from .__main__ import start

    cp = start(tmp_path_factory.mktemp("realcluster") / "state", None)
    try:
        yield RealCluster(cp)
    finally:
        cp.stop()
