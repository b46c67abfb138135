"""Rendering as data (no database, no cluster): architectures A–F against the upstream CRD schemas and
the sandbox's validator, and the exact manifests for a small fixture."""

from __future__ import annotations

import random
from decimal import Decimal as D
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml

from quotas import manifests as m
from quotas.manifests import ClusterRow, FlavorRow, ProjectRow, QuotaRow, Snapshot, TenantRow
from sandbox.store import ApiError, Store

CRDS = Path(__file__).resolve().parents[2] / "sandbox" / "crds"
GPU = "nvidia.com/gpu"
TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

FLAVORS = (
    FlavorRow("h100-80gb", "whole", (GPU,), {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", m.POOL_LABEL: "offline"},
              (TAINT,), (TOL,), "offline", 10),
    FlavorRow("h100-80gb-online", "whole", (GPU,), {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", m.POOL_LABEL: "online"},
              (TAINT, {"key": m.POOL_LABEL, "value": "online", "effect": "NoSchedule"}),
              (TOL, {"key": m.POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"}), "online", 11),
    FlavorRow("a100-80gb-mig-1g.10gb", "mig", ("nvidia.com/mig-1g.10gb",), {"nvidia.com/mig.strategy": "mixed"}, (TAINT,), (TOL,),
              "online", 20),
    FlavorRow("l40s-hami", "hami", (GPU, "nvidia.com/total-gpucores", "nvidia.com/total-gpumem"), {"gpu": "on"}, (TAINT,), (TOL,),
              "offline", 30),
    FlavorRow("cpu", "cpu", ("cpu", "memory"), {}, (), (), "", 90),
)
ACME = TenantRow("acme", quotas=(
    QuotaRow("h100-80gb", GPU, D(12)), QuotaRow("h100-80gb-online", GPU, D(4)),
    QuotaRow("a100-80gb-mig-1g.10gb", "nvidia.com/mig-1g.10gb", D(8)),
    QuotaRow("l40s-hami", GPU, D(20)), QuotaRow("l40s-hami", "nvidia.com/total-gpucores", D(200)),
    QuotaRow("l40s-hami", "nvidia.com/total-gpumem", D(92136)),
    QuotaRow("cpu", "cpu", D(64)), QuotaRow("cpu", "memory", D(512)),
))
VISION = ProjectRow("acme-vision", "acme", quotas=(
    QuotaRow("h100-80gb", GPU, D(6), D(4), D(2)), QuotaRow("h100-80gb-online", GPU, D(2)),
    QuotaRow("cpu", "cpu", D("16.5")), QuotaRow("cpu", "memory", D(128)),
))
NLP = ProjectRow("acme-nlp", "acme", quotas=(QuotaRow("h100-80gb", GPU, D(4)),))
GLOBEX = TenantRow("globex", active=False, quotas=(QuotaRow("h100-80gb", GPU, D(8)),))
LLM = ProjectRow("globex-llm", "globex", quotas=(QuotaRow("h100-80gb", GPU, D(8)),))


def snapshot(arch: str, **flags: bool) -> Snapshot:
    cluster = ClusterRow("demo", arch, use_mig=flags.get("use_mig", True), use_hami=flags.get("use_hami", True),
                         volcano_capacity_plugin=flags.get("capacity", True))
    return Snapshot(cluster, FLAVORS, (ACME, GLOBEX), (VISION, NLP, LLM))


def render(arch: str, **flags: bool) -> list[dict]:
    snap = snapshot(arch, **flags)
    return m.desired_state(snap.cluster, snap)


def find(objects: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


@cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema of every served version of every upstream CRD copy."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[tuple[str, str], dict] = {}
    for path in CRDS.glob("*/*.yaml"):
        doc = yaml.load(path.read_text(), Loader=loader)
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for version in spec["versions"]:
            out[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return out


def crd_schema(api_version: str, kind: str) -> dict | None:
    return crd_schemas().get((api_version, kind))


ARCHS = ["A", "B", "C", "D", "E", "F"]


@pytest.mark.parametrize("arch", ARCHS)
def test_every_object_validates_against_the_upstream_crd_schema(arch: str) -> None:
    for obj in render(arch):
        if "/" not in obj["apiVersion"] or obj["apiVersion"].startswith(("apps/", "batch/")):
            continue  # built-in kinds: checked by the sandbox validator below
        schema = crd_schema(obj["apiVersion"], obj["kind"])
        assert schema is not None, f"no CRD for {obj['apiVersion']} {obj['kind']}"
        jsonschema.validate(obj, schema)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_object_passes_the_sandbox_validator_with_cel_rules(arch: str) -> None:
    store = Store()
    for obj in render(arch):
        try:  # namespaces for real (the namespaced objects need them), the rest as dry runs
            store.create(obj, dry_run=obj["kind"] != "Namespace", field_manager="gpu-portal")
        except ApiError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.status()}")


@pytest.mark.parametrize("arch", ARCHS)
def test_structural_rules(arch: str) -> None:
    objects = render(arch)
    keys = [m.object_key(o) for o in objects]
    assert len(keys) == len(set(keys)), "one object per key"
    assert [o for o in objects] == m.sort_objects(objects)
    for obj in objects:
        assert obj["metadata"]["labels"][m.MANAGED_BY] == "gpu-portal"
        if obj["kind"] == "LocalQueue":
            assert obj["metadata"]["name"] != "default"  # would gate Volcano's pods (docs/cluster-objects.md)
        if obj["kind"] == "Namespace":
            labels = obj["metadata"]["labels"]
            assert labels[m.TENANT_LABEL] and labels[m.PROJECT_LABEL] == obj["metadata"]["name"]
        if obj["kind"] in ("ClusterQueue", "Cohort"):
            seen: set[str] = set()
            for group in obj["spec"].get("resourceGroups", []):
                assert not seen & set(group["coveredResources"]), "a resource in one group only"
                seen |= set(group["coveredResources"])
                for flavor in group["flavors"]:
                    assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
    # Namespaces, LocalQueues and guard rails for active projects only; the archived/unknown get nothing.
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"} == {"acme-nlp", "acme-vision", "globex-llm"}


@pytest.mark.parametrize("arch", ARCHS)
def test_rendering_is_stable_whatever_the_input_order(arch: str) -> None:
    snap = snapshot(arch)
    rng = random.Random(7)
    shuffled = Snapshot(snap.cluster, tuple(rng.sample(FLAVORS, len(FLAVORS))), tuple(reversed(snap.tenants)),
                        tuple(rng.sample(snap.projects, len(snap.projects))))
    assert m.desired_state(shuffled.cluster, shuffled) == m.desired_state(snap.cluster, snap)


def test_flavor_kinds_per_architecture() -> None:
    def flavors(arch: str, **flags: bool) -> set[str]:
        return {o["metadata"]["name"] for o in render(arch, **flags) if o["kind"] == "ResourceFlavor"}

    whole = {"h100-80gb", "h100-80gb-online", "cpu"}
    assert flavors("A") == flavors("B") == whole
    assert flavors("C") == whole | {"a100-80gb-mig-1g.10gb"}
    assert flavors("D") == whole | {"l40s-hami"}
    assert flavors("E") == {"h100-80gb-online", "cpu", "a100-80gb-mig-1g.10gb", "l40s-hami"}  # offline H100: Volcano's
    assert flavors("E", use_mig=False, use_hami=False) == {"h100-80gb-online", "cpu"}
    assert flavors("F") == whole | {"a100-80gb-mig-1g.10gb", "l40s-hami"}


def test_b_manifests_match_the_expected_objects() -> None:
    objects = render("B")
    # Every object also carries the ownership marks (m.mark: installation label and owner annotation).
    assert find(objects, "ResourceFlavor", "h100-80gb-online") == m.mark({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "h100-80gb-online", "labels": {m.MANAGED_BY: "gpu-portal"}},
        "spec": {"nodeLabels": {"gpuportal.dev/pool": "online", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                 "nodeTaints": [TAINT, {"key": m.POOL_LABEL, "value": "online", "effect": "NoSchedule"}],
                 "tolerations": [TOL, {"key": m.POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"}]},
    }, "gpu-portal")
    labels = {m.MANAGED_BY: "gpu-portal", m.TENANT_LABEL: "acme", m.PROJECT_LABEL: "acme-vision"}
    assert find(objects, "ClusterQueue", "acme-vision") == m.mark({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "acme-vision", "labels": labels},
        "spec": {
            "cohortName": "acme",
            "namespaceSelector": {"matchLabels": {m.PROJECT_LABEL: "acme-vision"}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {"coveredResources": [GPU], "flavors": [
                    {"name": "h100-80gb", "resources": [{"name": GPU, "nominalQuota": "6", "borrowingLimit": "4", "lendingLimit": "2"}]},
                    {"name": "h100-80gb-online", "resources": [{"name": GPU, "nominalQuota": "2"}]},
                ]},
                {"coveredResources": ["cpu", "memory"], "flavors": [
                    {"name": "cpu", "resources": [{"name": "cpu", "nominalQuota": "16500m"}, {"name": "memory", "nominalQuota": "128Gi"}]},
                ]},
            ],
            "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
            "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
            "stopPolicy": "None",
        },
    }, "gpu-portal")
    # The cohort holds what the tenant has not given to its projects: 12 - 6 - 4 = 2 offline H100s.
    cohort = find(objects, "Cohort", "acme")
    gpus = {f["name"]: f["resources"][0]["nominalQuota"] for f in cohort["spec"]["resourceGroups"][0]["flavors"]}
    assert gpus == {"h100-80gb": "2", "h100-80gb-online": "2"}
    assert "borrowingLimit" not in str(cohort)  # a cohort without a parent may not have limits
    assert find(objects, "LocalQueue", "acme-vision") == m.mark({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "acme-vision", "namespace": "acme-vision", "labels": labels},
        "spec": {"clusterQueue": "acme-vision"},
    }, "gpu-portal")
    assert find(objects, "Namespace", "acme-vision")["metadata"]["labels"] == {
        **labels, **m.POD_SECURITY, m.INSTALLATION_LABEL: "gpu-portal"}
    # The guard rail: at most what the project could ever be admitted: offline 6 + 4 borrowed, online
    # 2 with no borrowing limit = the tenant's 4.
    quota = next(o for o in objects if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"] == "acme-vision")
    assert quota["spec"] == {"hard": {"requests.nvidia.com/gpu": "14"}}
    limit = next(o for o in objects if o["kind"] == "LimitRange" and o["metadata"]["namespace"] == "acme-vision")
    assert limit["spec"] == {"limits": [{"type": "Container", "defaultRequest": {"cpu": "100m", "memory": "256Mi"}}]}
    # A suspended tenant's queues admit nothing new.
    assert find(objects, "ClusterQueue", "globex-llm")["spec"]["stopPolicy"] == "Hold"
    assert [(o["metadata"]["name"], o["value"]) for o in objects if o["kind"] == "WorkloadPriorityClass"] == [
        ("batch", 100), ("interactive", 500), ("production", 1000)]


def test_a_is_one_shared_queue_without_cohorts() -> None:
    objects = render("A")
    assert not [o for o in objects if o["kind"] == "Cohort"]
    queues = [o for o in objects if o["kind"] == "ClusterQueue"]
    assert [q["metadata"]["name"] for q in queues] == ["shared"]
    shared = queues[0]["spec"]
    assert "cohortName" not in shared and "borrowingLimit" not in str(shared)
    assert shared["namespaceSelector"] == {"matchExpressions": [{"key": m.PROJECT_LABEL, "operator": "Exists"}]}
    h100 = shared["resourceGroups"][0]["flavors"][0]
    assert h100 == {"name": "h100-80gb", "resources": [{"name": GPU, "nominalQuota": "20"}]}  # acme 12 + globex 8
    assert {o["spec"]["clusterQueue"] for o in objects if o["kind"] == "LocalQueue"} == {"shared"}


def test_c_and_d_add_mig_and_hami_resources() -> None:
    c = find(render("C"), "ClusterQueue", "acme-vision")["spec"]["resourceGroups"]
    assert ["nvidia.com/mig-1g.10gb"] in [g["coveredResources"] for g in c]
    d = find(render("D"), "Cohort", "acme")["spec"]["resourceGroups"]
    gpu_group = d[0]
    # Whole GPUs and HAMi share nvidia.com/gpu, so they share a group; HAMi quota is in the totals (docs/cluster-objects.md).
    assert gpu_group["coveredResources"] == [GPU, "nvidia.com/total-gpucores", "nvidia.com/total-gpumem"]
    hami = next(f for f in gpu_group["flavors"] if f["name"] == "l40s-hami")
    assert hami["resources"] == [{"name": GPU, "nominalQuota": "20"}, {"name": "nvidia.com/total-gpucores", "nominalQuota": "200"},
                                 {"name": "nvidia.com/total-gpumem", "nominalQuota": "92136"}]


def test_e_never_grants_the_same_gpus_twice() -> None:
    objects = render("E")
    # Kueue does not know the offline H100s at all...
    for obj in objects:
        if obj["kind"] in ("ClusterQueue", "Cohort", "ResourceFlavor"):
            assert "'h100-80gb'" not in str(obj), obj["metadata"]["name"]
    # ...and the project's offline H100 quota becomes its Volcano queue.
    assert find(objects, "Queue", "acme-vision") == m.mark({
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "acme-vision", "labels": {m.MANAGED_BY: "gpu-portal", m.TENANT_LABEL: "acme",
                                                       m.PROJECT_LABEL: "acme-vision"}},
        "spec": {"weight": 6, "reclaimable": True, "capability": {GPU: "10"}, "deserved": {GPU: "6"},
                 "guarantee": {"resource": {GPU: "4"}}},
    }, "gpu-portal")
    nlp = find(objects, "Queue", "acme-nlp")["spec"]
    assert nlp["capability"] == {GPU: "12"}  # no borrowing limit: up to the tenant's training share
    without_plugin = find(render("E", capacity=False), "Queue", "acme-vision")["spec"]
    assert set(without_plugin) == {"weight", "reclaimable", "capability"}
    assert find(objects, "Namespace", "acme-vision")["metadata"]["labels"][m.VOLCANO_QUEUE_LABEL] == "acme-vision"
    # Volcano queues exist only in E.
    for arch in "ABCDF":
        assert not [o for o in render(arch) if o["kind"] == "Queue"]


def test_f_separates_pools_and_lends_offline_to_online_explicitly() -> None:
    objects = render("F")
    offline = find(objects, "ClusterQueue", "acme-vision")["spec"]
    online = find(objects, "ClusterQueue", "acme-vision-online")["spec"]
    offline_flavors = [f["name"] for g in offline["resourceGroups"] for f in g["flavors"]]
    online_flavors = [f["name"] for g in online["resourceGroups"] for f in g["flavors"]]
    assert "h100-80gb-online" not in offline_flavors and "a100-80gb-mig-1g.10gb" not in offline_flavors
    assert online_flavors[:2] == ["h100-80gb-online", "h100-80gb"]  # own pool first, then what is lent
    lent = online["resourceGroups"][0]["flavors"][1]["resources"][0]
    assert lent == {"name": GPU, "nominalQuota": "0", "borrowingLimit": "2"}  # acme-vision lends 2
    assert online["preemption"]["borrowWithinCohort"] == {"policy": "LowerPriority", "maxPriorityThreshold": 100}
    assert offline["preemption"]["reclaimWithinCohort"] == "Any"
    queues = {o["metadata"]["name"]: o["spec"]["clusterQueue"] for o in objects if o["kind"] == "LocalQueue"
              and o["metadata"]["namespace"] == "acme-vision"}
    assert queues == {"acme-vision": "acme-vision", "acme-vision-online": "acme-vision-online"}
    cluster = snapshot("F").cluster
    assert m.local_queue_name(cluster, "acme-vision", serving=True) == "acme-vision-online"
    assert m.local_queue_name(cluster, "acme-vision") == "acme-vision"
    # Without any lending, the online queue cannot reach offline GPUs at all.
    no_lending = Snapshot(cluster, FLAVORS, (ACME,), (ProjectRow("acme-vision", "acme", quotas=(QuotaRow("h100-80gb", GPU, D(6)),)),))
    online = find(m.desired_state(cluster, no_lending), "ClusterQueue", "acme-vision-online")["spec"]
    assert "h100-80gb" not in [f["name"] for g in online["resourceGroups"] for f in g["flavors"]]
