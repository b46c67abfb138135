"""``gpuportal submit`` of an inference service: its replicas and minimum, its class (docs/inference.md)."""

from __future__ import annotations

import pytest

from workloads.models import WorkloadRequest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
SERVE = ("inference", "--flavor", "h100", "-p", "model_uri=hf://org/tiny-llm")


def test_a_minimum_above_the_replicas_or_a_lower_class_exits_2_with_the_field_error(gp, cat) -> None:
    run = gp("submit", *SERVE, "--replicas", "2", "-p", "min_replicas=3")
    assert run.returncode == 2, run.stderr
    assert "parameters.min_replicas: The minimum (3) cannot be above the replicas (2)" in run.stderr
    run = gp("submit", *SERVE, "--priority", "batch")
    assert run.returncode == 2 and "priority: Inference services always run at production priority" in run.stderr
    assert not WorkloadRequest.objects.exists()
    made = gp("submit", *SERVE, "--replicas", "3", "-p", "min_replicas=1", "-q")
    assert made.returncode == 0, made.stderr
    req = WorkloadRequest.objects.get(pk=int(made.stdout))
    assert (req.replicas, req.parameters["min_replicas"], req.priority) == (3, 1, "production")
