"""Rendering a request into Kubernetes objects: pure dicts, no database, validated by the sandbox's schemas.

Every template × architecture (× the flavor kinds the architecture offers) is created with ``dryRun`` in a
``sandbox.store.Store``: the same schema validation (CRD openAPIV3Schema for Volcano, the built-in schemas for
Jobs, StatefulSets, Deployments, Services) the sandbox cluster runs on a real apply.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from quotas.models import Cluster, Flavor
from sandbox.store import Store
from tenants.models import Project, Tenant
from workloads.manifests import (
    PRIORITY_LABEL,
    QUEUE_LABEL,
    REQUEST_LABEL,
    SANDBOX_DURATION,
    manifests_hash,
)
from workloads.kinds import request_manifests
from workloads.models import ServiceTemplate, WorkloadRequest

NAMESPACE = "acme-vision"
FLAVOR_KINDS_BY_ARCH = {
    "A": ["whole"],
    "B": ["whole"],
    "C": ["whole", "mig"],
    "D": ["whole", "hami"],
    "E": ["whole", "mig", "hami"],
    "F": ["whole", "mig"],
}
CASES = [
    (arch, flavor_kind, kind, replicas)
    for arch, kinds in FLAVOR_KINDS_BY_ARCH.items()
    for flavor_kind in kinds
    for kind in ("notebook", "training", "inference")
    for replicas in ((1,) if kind == "notebook" else (1, 3))
]
GPU_TAINT_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def make_flavor(kind: str, *, architecture: str, pool: str = "") -> Flavor:
    cluster = Cluster(name="sandbox", architecture=architecture)
    if kind == "mig":
        return Flavor(cluster=cluster, name="a100-1g-10gb", display_name="A100 1g.10gb", kind="mig", mig_profile="1g.10gb",
                      node_labels={"nvidia.com/mig.config": "all-balanced"}, tolerations=[GPU_TAINT_TOLERATION], pool_label=pool)
    if kind == "hami":
        return Flavor(cluster=cluster, name="l40s-hami-12g", display_name="L40S 12 GB share", kind="hami",
                      hami_memory_mib=12288, hami_cores_percent=25, node_labels={"gpu": "on"},
                      tolerations=[GPU_TAINT_TOLERATION], pool_label=pool)
    return Flavor(cluster=cluster, name="h100-80gb", display_name="H100", kind="whole",
                  node_labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, tolerations=[GPU_TAINT_TOLERATION],
                  pool_label=pool)


def make_request(kind: str, *, architecture: str = "B", flavor_kind: str = "whole", replicas: int = 1, gpus: int = 2,
                 parameters: dict[str, Any] | None = None, pool: str = "") -> WorkloadRequest:
    tenant = Tenant(slug="acme", name="Acme")
    project = Project(slug=NAMESPACE, name="Vision", tenant=tenant)
    flavor = make_flavor(flavor_kind, architecture=architecture, pool=pool)
    return WorkloadRequest(
        pk=42, tenant=tenant, project=project, cluster=flavor.cluster, template=ServiceTemplate(kind=kind, slug=kind),
        flavor=flavor, name="job", image="registry.example/pytorch:2.5", gpus=gpus, replicas=replicas,
        cpu=Decimal("2.50"), memory_gib=16, parameters=parameters or {}, duration_hours=3, priority="batch",
    )


def dry_run(objects: list[dict]) -> list[dict]:
    """Create every object with dryRun in a fresh store (schemas, defaults, built-in checks); returns what it stored."""
    store = Store()
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    # Volcano's admission refuses a Job whose queue does not exist: the project's queue is there, as the
    # quota reconcile would have made it.
    for queue in sorted({o["spec"].get("queue") for o in objects if o["apiVersion"].startswith("batch.volcano.sh/")} - {None}):
        store.create({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": queue},
                      "spec": {"weight": 1}})
    out = []
    for obj in objects:
        warnings: list[str] = []
        out.append(store.create(obj, dry_run=True, warnings=warnings))
        assert warnings == [], f"{obj['kind']}: {warnings}"
    return out


def pod_templates(obj: dict) -> list[dict]:
    if obj["kind"] == "Job" and obj["apiVersion"].startswith("batch.volcano.sh"):
        return [task["template"] for task in obj["spec"]["tasks"]]
    if obj["kind"] in ("Job", "StatefulSet", "Deployment"):
        return [obj["spec"]["template"]]
    return []


def top_level(objects: list[dict]) -> dict:
    return next(o for o in objects if o["kind"] in ("Job", "StatefulSet", "Deployment"))


@pytest.mark.parametrize(("architecture", "flavor_kind", "kind", "replicas"), CASES)
@pytest.mark.parametrize("pool", ["", "offline", "online"])
def test_every_template_and_architecture_validates(architecture: str, flavor_kind: str, kind: str, replicas: int,
                                                    pool: str) -> None:
    request = make_request(kind, architecture=architecture, flavor_kind=flavor_kind, replicas=replicas, pool=pool,
                           parameters={"env": {"WANDB_MODE": "offline"}, "command": "python train.py"})
    objects = request_manifests(request, notebook_token="t0ken")
    stored = dry_run(objects)
    assert [o["metadata"]["name"] for o in stored] == [o["metadata"]["name"] for o in objects]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["gpuportal.dev/tenant"] == "acme"
        assert labels["gpuportal.dev/project"] == NAMESPACE
        assert labels[REQUEST_LABEL] == "42"
        assert obj["metadata"]["namespace"] == NAMESPACE
        assert obj["metadata"]["name"].startswith("req-42")
        for template in pod_templates(obj):
            assert template["metadata"]["labels"][REQUEST_LABEL] == "42"
            for container in template["spec"]["containers"]:
                assert container["resources"]["requests"] == container["resources"]["limits"]


def test_rendering_is_deterministic() -> None:
    for kind in ("notebook", "training", "inference"):
        first = request_manifests(make_request(kind, replicas=2), notebook_token="x")
        again = request_manifests(make_request(kind, replicas=2), notebook_token="x")
        assert first == again
        assert manifests_hash(first) == manifests_hash(again)
    assert manifests_hash(request_manifests(make_request("inference", replicas=2))) != manifests_hash(
        request_manifests(make_request("inference", replicas=3))
    )


def test_notebook_is_a_statefulset_with_home_volume_and_a_service() -> None:
    objects = request_manifests(make_request("notebook", parameters={"home_size_gib": 50}), notebook_token="t0ken")
    assert [o["kind"] for o in objects] == ["Secret", "Service", "StatefulSet"]
    secret, svc, sts = objects
    assert secret["stringData"] == {"token": "t0ken"}
    assert sts["metadata"]["labels"][QUEUE_LABEL] == NAMESPACE
    assert sts["metadata"]["labels"][PRIORITY_LABEL] == "batch"
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["serviceName"] == "req-42"
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "50Gi"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["jupyter", "lab"]
    assert {"name": "home", "mountPath": "/home/jovyan"} in container["volumeMounts"]
    assert QUEUE_LABEL not in sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"] == {REQUEST_LABEL: "42"}
    assert SANDBOX_DURATION not in (sts["metadata"].get("annotations") or {})  # runs until stopped or expired

    vscode = top_level(request_manifests(make_request("notebook", parameters={"ide": "vscode"})))
    assert vscode["spec"]["template"]["spec"]["containers"][0]["command"][0] == "code-server"


def test_single_node_training_is_a_kueue_job() -> None:
    objects = request_manifests(make_request("training", parameters={"retries": 2, "data_volume": "datasets"}))
    assert [o["kind"] for o in objects] == ["Job"]
    job = objects[0]
    assert job["apiVersion"] == "batch/v1"
    assert job["metadata"]["labels"][QUEUE_LABEL] == NAMESPACE
    assert job["metadata"]["labels"][PRIORITY_LABEL] == "batch"
    assert "suspend" not in job["spec"]  # Kueue's webhook suspends it; we never set it (docs/cluster-objects.md)
    assert job["spec"]["backoffLimit"] == 2
    assert job["metadata"]["annotations"][SANDBOX_DURATION] == "3h"
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}]
    assert spec["containers"][0]["resources"]["limits"] == {"cpu": "2500m", "memory": "16Gi", "nvidia.com/gpu": "2"}
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"] == [GPU_TAINT_TOLERATION]


def test_distributed_training_under_e_is_a_volcano_gang() -> None:
    objects = request_manifests(make_request("training", architecture="E", replicas=4, pool="offline"))
    assert [(o["apiVersion"], o["kind"]) for o in objects] == [("batch.volcano.sh/v1alpha1", "Job")]
    vcjob = objects[0]
    spec = vcjob["spec"]
    assert spec["minAvailable"] == 4
    assert spec["queue"] == NAMESPACE
    assert spec["schedulerName"] == "volcano"
    assert set(spec["plugins"]) == {"pytorch", "env", "svc"}
    assert [(t["name"], t["replicas"]) for t in spec["tasks"]] == [("master", 1), ("worker", 3)]
    # No Kueue label anywhere: each pod would otherwise become its own Workload (docs/cluster-objects.md).
    assert QUEUE_LABEL not in vcjob["metadata"]["labels"]
    for task in spec["tasks"]:
        assert QUEUE_LABEL not in task["template"]["metadata"]["labels"]
        # Kueue never injects flavor placement into Volcano pods: we write it.
        assert task["template"]["spec"]["tolerations"] == [GPU_TAINT_TOLERATION]
        assert task["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert vcjob["metadata"]["annotations"][SANDBOX_DURATION] == "3h"


def test_single_node_training_on_volcano_owned_gpus_under_e_is_a_volcano_job() -> None:
    # Kueue has no ResourceFlavor for the offline whole GPUs under E (quotas.manifests.volcano_owned).
    objects = request_manifests(make_request("training", architecture="E", replicas=1, pool="offline"))
    assert [(o["apiVersion"], o["kind"]) for o in objects] == [("batch.volcano.sh/v1alpha1", "Job")]
    assert [(t["name"], t["replicas"]) for t in objects[0]["spec"]["tasks"]] == [("master", 1)]
    assert objects[0]["spec"]["minAvailable"] == 1


@pytest.mark.parametrize("flavor_kind", ["mig", "hami", "whole"])
def test_training_under_e_on_kueue_flavors_stays_with_kueue(flavor_kind: str) -> None:
    pool = "online" if flavor_kind == "whole" else ""
    objects = request_manifests(make_request("training", architecture="E", flavor_kind=flavor_kind, replicas=2, pool=pool))
    assert [(o["apiVersion"], o["kind"]) for o in objects] == [("v1", "Service"), ("batch/v1", "Job")]
    assert objects[1]["metadata"]["labels"][QUEUE_LABEL] == NAMESPACE


@pytest.mark.parametrize("architecture", ["A", "B", "C", "D", "E", "F"])
def test_distributed_training_elsewhere_is_an_indexed_kueue_job(architecture: str) -> None:
    objects = request_manifests(make_request("training", architecture=architecture, replicas=3))
    assert [o["kind"] for o in objects] == ["Service", "Job"]
    svc, job = objects
    assert svc["spec"]["clusterIP"] == "None"
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 3
    assert job["metadata"]["labels"][QUEUE_LABEL] == NAMESPACE
    assert job["spec"]["template"]["spec"]["subdomain"] == "req-42"
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WORLD_SIZE"]["value"] == "3"
    assert env["MASTER_ADDR"]["value"] == "req-42-0.req-42"


def test_inference_is_a_deployment_with_service_and_probe() -> None:
    objects = request_manifests(make_request(
        "inference", replicas=3, parameters={"port": 9000, "readiness_path": "/ready", "model_uri": "s3://models/llama"}))
    assert [o["kind"] for o in objects] == ["Service", "Deployment"]
    svc, deploy = objects
    assert deploy["spec"]["replicas"] == 3
    assert deploy["metadata"]["labels"][QUEUE_LABEL] == NAMESPACE
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 9000}
    assert {"name": "MODEL_URI", "value": "s3://models/llama"} in container["env"]
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert "gpuportal.dev/pool" not in deploy["spec"]["template"]["spec"]["nodeSelector"]


def test_inference_under_f_is_placed_on_the_online_pool() -> None:
    deploy = top_level(request_manifests(make_request("inference", architecture="F", pool="online")))
    spec = deploy["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["gpuportal.dev/pool"] == "online"
    assert {"key": "gpuportal.dev/pool", "operator": "Equal", "value": "online", "effect": "NoSchedule"} in spec["tolerations"]
    # ...and into the project's online LocalQueue (quotas.manifests: ``<project>-online`` under F).
    assert deploy["metadata"]["labels"][QUEUE_LABEL] == f"{NAMESPACE}-online"
    # Training under F stays off the online pool unless its flavor says otherwise.
    job = top_level(request_manifests(make_request("training", architecture="F")))
    assert "gpuportal.dev/pool" not in job["spec"]["template"]["spec"]["nodeSelector"]


@pytest.mark.parametrize(
    ("flavor_kind", "expected"),
    [
        ("whole", {"nvidia.com/gpu": "2"}),
        ("mig", {"nvidia.com/mig-1g.10gb": "2"}),
        ("hami", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "12288", "nvidia.com/gpucores": "25"}),
    ],
)
def test_gpu_resources_per_flavor_are_explicit(flavor_kind: str, expected: dict[str, str]) -> None:
    job = top_level(request_manifests(make_request("training", architecture="D", flavor_kind=flavor_kind)))
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert {k: v for k, v in limits.items() if k.startswith("nvidia.com/")} == expected
    assert limits["cpu"] == "2500m" and limits["memory"] == "16Gi"


def test_cpu_only_request_has_no_gpu_resources() -> None:
    job = top_level(request_manifests(make_request("training", gpus=0)))
    assert set(job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]) == {"cpu", "memory"}


def test_notebook_access_url() -> None:
    from workloads.manifests import notebook_access_url

    # No token in the link: the portal (or the ingress asking it) authorises and adds the token on the way in.
    assert notebook_access_url(request_id=1, ide="jupyterlab") == "/notebooks/1/lab"
    assert notebook_access_url(request_id=1, ide="vscode", base_url="https://nb.example/") == "https://nb.example/notebooks/1/"


def test_a_request_kueue_chooses_for_allows_each_flavor_by_node_affinity_and_validates() -> None:
    """Kueue's flavor fungibility (docs/cluster-objects.md, "Flavor fungibility"): the labels the flavors share stay in
    the nodeSelector, the GPU product becomes one required node-affinity term per flavor, tolerations are the union."""
    req = make_request("training", architecture="F", pool="offline", replicas=3)
    a100_toleration = {"key": "a100", "operator": "Exists", "effect": "NoSchedule"}
    req.kueue_flavors = [
        {"name": "h100-80gb", "model": "h100-80gb", "tolerations": [GPU_TAINT_TOLERATION],
         "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "offline"}},
        {"name": "a100-80gb", "model": "a100-80gb", "tolerations": [GPU_TAINT_TOLERATION, a100_toleration],
         "node_labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "gpuportal.dev/pool": "offline"}},
    ]
    req.flavor.node_labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "offline"}
    objects = request_manifests(req)
    dry_run(objects)
    spec = top_level(objects)["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpuportal.dev/pool": "offline"}
    assert spec["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]},
    ]}}}
    assert GPU_TAINT_TOLERATION in spec["tolerations"] and a100_toleration in spec["tolerations"]
    assert spec["tolerations"].count(GPU_TAINT_TOLERATION) == 1
    # Pinned (no choice, or a choice of one): the flavor's nodeSelector, no affinity.
    req.kueue_flavors = req.kueue_flavors[:1]
    pinned = top_level(request_manifests(req))["spec"]["template"]["spec"]
    assert pinned["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and "affinity" not in pinned
