"""Parity for Kueue's own Topology Aware Scheduling samples (issue 26): ``site/static/examples/tas`` applied as
Kueue's TAS documentation says, on a sandbox and on a real control plane started here with the same nodes (two
blocks of two racks of two 8-CPU nodes labelled as the samples expect, built by the sandbox's own
``sandbox/profile.py``; real Kueue v0.17, kube-scheduler and kwok). The same outcomes are asserted on both: which
sample Jobs are admitted, their ``topologyAssignment`` and where their pods run, which wait and with what message,
which Kueue refuses and with what error (``tests/sandbox/test_kueue_tas_examples.py: EXPECTED``).
"""

from __future__ import annotations

import json

import pytest
import yaml

from realcluster.testing import RealCluster, built

from ..sandbox.test_kueue_tas_examples import EXPECTED, PROFILE, scenario

pytestmark = [pytest.mark.xdist_group("realcluster"), pytest.mark.timeout(400)]


@pytest.fixture(params=["sandbox", "real"])
def tas_cluster(request, tmp_path):
    if request.param == "sandbox":
        from sandbox.testing import _start

        sb = _start(tmp_path / "sandbox", profile=PROFILE)
        try:
            yield sb
        finally:
            sb.stop()
        return
    if not built():
        pytest.skip("the real control plane is not built (make cluster-build)")
    from realcluster.__main__ import start

    profile = tmp_path / "tas-profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    real = RealCluster(start(tmp_path / "real", profile))
    try:
        yield real
    finally:
        real.cp.stop()


def test_kueues_tas_samples_behave_alike(tas_cluster) -> None:
    seen = scenario(tas_cluster)
    print(json.dumps(seen, indent=1, sort_keys=True))  # shown when the comparison fails
    assert seen == EXPECTED, (getattr(tas_cluster, "kind", "sandbox"), json.dumps(seen, indent=1, sort_keys=True))
