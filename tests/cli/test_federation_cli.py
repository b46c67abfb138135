"""`gpuportal submit` declares what the image needs, the models it accepts and consent to spill over
(docs/federation.md); a model that cannot run the image is refused (exit 2) with why, and nothing is created."""

from __future__ import annotations

import pytest

from quotas.models import Flavor
from workloads.models import WorkloadRequest

pytestmark = pytest.mark.django_db(transaction=True)
TRAIN = ("training", "-p", "command=python train.py", "--flavor", "h100")


def test_submit_declares_models_needs_and_consent(gp, cat) -> None:
    Flavor.objects.filter(pk=cat.h100.pk).update(gpu_memory_mib=81559, compute_capability="9.0")
    Flavor.objects.filter(pk=cat.mig.pk).update(gpu_memory_mib=10240, compute_capability="8.0")
    refused = gp("submit", *TRAIN, "--accept-model", "h100-80gb", "--spill-consent", "--min-gpu-memory", "100")
    assert refused.returncode == 2
    assert "accepted_models: Incompatible: h100-80gb has 79.6 GiB per GPU; the image needs 100 GiB." in refused.stderr
    bad = gp("submit", *TRAIN, "--min-compute-capability", "nine")
    assert bad.returncode == 2 and "min_compute_capability: A CUDA compute capability such as 8.0" in bad.stderr
    assert not WorkloadRequest.objects.exists()

    done = gp("submit", *TRAIN, "--accept-model", "h100-80gb", "--accept-model", "a100-80gb", "--spill-consent",
              "--min-gpu-memory", "10", "-q")
    assert done.returncode == 0, done.stderr
    req = WorkloadRequest.objects.get()
    assert (req.accepted_models, req.min_gpu_memory_gib, req.spill_consent) == (["h100-80gb", "a100-80gb"], 10, True)
