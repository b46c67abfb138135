"""Cluster hygiene in rendered objects: finished Jobs are cleaned up by the cluster (ttlSecondsAfterFinished),
every pod runs restricted (non-root, RuntimeDefault seccomp, no privilege escalation, no capabilities).

Pure rendering, validated by the sandbox's schemas (the built-in ones and Volcano's CRD) with a dry-run create,
as in test_render.py."""

from __future__ import annotations

import pytest

from workloads.kinds import request_manifests
from workloads.manifests import DEFAULT_JOB_TTL_SECONDS

from .test_render import CASES, dry_run, make_request, pod_templates

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


@pytest.mark.parametrize(("architecture", "flavor_kind", "kind", "replicas"), CASES)
def test_every_pod_runs_restricted(architecture: str, flavor_kind: str, kind: str, replicas: int) -> None:
    request = make_request(kind, architecture=architecture, flavor_kind=flavor_kind, replicas=replicas,
                           parameters={"command": "python train.py", "data_volume": "datasets"})
    objects = request_manifests(request, notebook_token="t0ken")
    stored = dry_run(objects)  # the schemas accept every field
    templates = [t for obj in stored for t in pod_templates(obj)]
    assert templates
    for template in templates:
        pod = template["spec"]["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["runAsUser"] == 1000
        # Notebook images' user (jovyan) is in group 100, which owns the home directory.
        assert pod["fsGroup"] == (100 if kind == "notebook" else 1000)
        for container in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            assert container["securityContext"] == RESTRICTED_CONTAINER


@pytest.mark.parametrize(("architecture", "flavor_kind", "replicas", "api_version"), [
    ("B", "whole", 1, "batch/v1"),
    ("B", "whole", 3, "batch/v1"),  # Indexed Job
    ("E", "whole", 1, "batch.volcano.sh/v1alpha1"),
    ("E", "whole", 3, "batch.volcano.sh/v1alpha1"),
])
def test_finished_jobs_are_cleaned_up_after_a_ttl(architecture: str, flavor_kind: str, replicas: int, api_version: str) -> None:
    request = make_request("training", architecture=architecture, flavor_kind=flavor_kind, replicas=replicas, pool="offline")
    job = next(o for o in dry_run(request_manifests(request)) if o["kind"] == "Job")
    assert job["apiVersion"] == api_version
    assert job["spec"]["ttlSecondsAfterFinished"] == DEFAULT_JOB_TTL_SECONDS == 3600

    custom = next(o for o in request_manifests(request, job_ttl_seconds=120) if o["kind"] == "Job")
    assert custom["spec"]["ttlSecondsAfterFinished"] == 120
    kept = next(o for o in request_manifests(request, job_ttl_seconds=None) if o["kind"] == "Job")
    assert "ttlSecondsAfterFinished" not in kept["spec"]


def test_long_running_objects_have_no_ttl() -> None:
    for kind in ("notebook", "inference"):
        for obj in request_manifests(make_request(kind), notebook_token="t"):
            assert "ttlSecondsAfterFinished" not in obj.get("spec", {})
