"""Schema validation of CRD objects (Kueue v1beta2, Volcano) and built-in kinds, through the store."""

import pytest

from sandbox import validation as V
from sandbox.quantity import canonical_quantity, cmp_quantity, format_quantity, parse_quantity
from sandbox.registry import default_registry
from sandbox.store import ApiError, Store

KQ = "kueue.x-k8s.io/v1beta2"


@pytest.fixture
def store():
    s = Store()
    s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    return s


def expect_invalid(fn, field, reason=None, code=422):
    with pytest.raises(ApiError) as ei:
        fn()
    e = ei.value
    assert e.code == code, e.status()
    fields = [c.get("field") for c in e.causes or []]
    assert field in fields, (fields, e.message)
    if reason:
        assert any(c["reason"] == reason for c in e.causes if c.get("field") == field), e.causes
    return e


# ----------------------------------------------------------------------------- registry
def test_registry_builtin_and_crds():
    r = default_registry()
    pod = r.by_kind("v1", "Pod")
    assert pod.plural == "pods" and pod.short_names == ("po",) and "all" in pod.categories and pod.namespaced
    assert r.by_plural("apps", "v1", "deployments").subresources == frozenset({"status", "scale"})
    assert not r.by_kind("v1", "Namespace").namespaced
    cq = r.by_kind(KQ, "ClusterQueue")
    assert cq.plural == "clusterqueues" and not cq.namespaced and "cq" in cq.short_names
    assert cq.subresources == frozenset({"status"}) and cq.schema["type"] == "object"
    assert cq.api_version == KQ and cq.resource == "clusterqueues.kueue.x-k8s.io"
    assert r.by_kind("kueue.x-k8s.io/v1beta1", "ClusterQueue") is not cq
    vj = r.by_plural("batch.volcano.sh", "v1alpha1", "jobs")
    assert vj.kind == "Job" and "vcjob" in vj.short_names and "status" in vj.subresources
    assert r.by_kind("scheduling.volcano.sh/v1beta1", "PodGroup").subresources == frozenset()
    assert not r.by_kind("scheduling.volcano.sh/v1beta1", "Queue").namespaced
    with pytest.raises(KeyError):
        r.by_kind("v1", "Nope")
    names = {(t.api_version, t.kind) for t in r.all()}
    for k in ("ResourceFlavor", "Cohort", "LocalQueue", "WorkloadPriorityClass", "Workload", "AdmissionCheck"):
        assert (KQ, k) in names
    assert ("bus.volcano.sh/v1alpha1", "Command") in names


# ----------------------------------------------------------------------------- quantity
@pytest.mark.parametrize(
    "s,val",
    [("500m", "0.5"), ("1Gi", "1073741824"), ("2", "2"), ("1e3", "1000"), ("1.5k", "1500"), ("100Mi", "104857600"), ("12e-3", "0.012")],
)
def test_parse_quantity(s, val):
    from decimal import Decimal

    assert parse_quantity(s) == Decimal(val)


def test_quantity_format_and_compare():
    assert format_quantity(parse_quantity("0.5")) == "500m"
    assert canonical_quantity("1536Mi") == "1536Mi"
    assert canonical_quantity("1000m") == "1"
    assert canonical_quantity("3000000") == "3M"
    assert cmp_quantity("1Gi", "1000Mi") == 1 and cmp_quantity("1", "1000m") == 0 and cmp_quantity(1, "2") == -1
    for bad in ("", "1.2.3", "abc", "1Gb", "Gi"):
        with pytest.raises(ValueError):
            parse_quantity(bad)


# ----------------------------------------------------------------------------- Kueue manifests accepted
RF = {"apiVersion": KQ, "kind": "ResourceFlavor", "metadata": {"name": "h100-80gb"},
      "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
               "nodeTaints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
               "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}
CQ = {"apiVersion": KQ, "kind": "ClusterQueue", "metadata": {"name": "tenant-a"},
      "spec": {"cohortName": "research",
               "namespaceSelector": {"matchLabels": {"portal.example/tenant": "tenant-a"}},
               "queueingStrategy": "BestEffortFIFO",
               "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                   "flavors": [{"name": "h100-80gb", "resources": [
                                       {"name": "cpu", "nominalQuota": 256},
                                       {"name": "memory", "nominalQuota": "2Ti"},
                                       {"name": "nvidia.com/gpu", "nominalQuota": 16, "borrowingLimit": 8, "lendingLimit": 8}]}]}],
               "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
               "stopPolicy": "None"}}


def test_kueue_manifests_accepted_with_defaults(store):
    store.create(RF)
    cq = store.create(CQ)
    assert cq["spec"]["flavorFungibility"] == {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}
    assert cq["spec"]["preemption"]["borrowWithinCohort"] == {"policy": "Never"}
    assert cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] == "2Ti"
    store.create({"apiVersion": KQ, "kind": "Cohort", "metadata": {"name": "research"}, "spec": {}})
    lq = store.create({"apiVersion": KQ, "kind": "LocalQueue", "metadata": {"name": "proj-42", "namespace": "team-a"},
                       "spec": {"clusterQueue": "tenant-a"}})
    assert lq["spec"]["clusterQueue"] == "tenant-a"
    wpc = store.create({"apiVersion": KQ, "kind": "WorkloadPriorityClass", "metadata": {"name": "interactive"},
                        "value": 1000, "description": "notebooks"})
    assert wpc["value"] == 1000
    wl = store.create({"apiVersion": KQ, "kind": "Workload", "metadata": {"name": "job-x-1a2b3", "namespace": "team-a"},
                       "spec": {"queueName": "proj-42", "podSets": [{"name": "main", "count": 2, "template": {"spec": {
                           "restartPolicy": "Never",
                           "containers": [{"name": "c", "image": "img", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": 1}}}]}}}]}})
    assert wl["spec"]["active"] is True
    assert wl["spec"]["podSets"][0]["count"] == 2


def test_volcano_manifests_accepted(store):
    store.create({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "research"},
                  "spec": {"weight": 1, "reclaimable": True, "capability": {"cpu": "64", "nvidia.com/gpu": 8}}})
    job = store.create({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "mpi", "namespace": "team-a"},
                        "spec": {"minAvailable": 3, "schedulerName": "volcano", "queue": "research",
                                 "plugins": {"ssh": [], "svc": [], "env": []},
                                 "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
                                 "tasks": [{"name": "master", "replicas": 1, "template": {"spec": {"restartPolicy": "OnFailure",
                                            "containers": [{"name": "m", "image": "mpi:1"}]}}},
                                           {"name": "worker", "replicas": 2, "template": {"spec": {
                                               "containers": [{"name": "w", "image": "mpi:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}]}})
    assert job["spec"]["tasks"][1]["replicas"] == 2
    store.create({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "pg", "namespace": "team-a"},
                  "spec": {"minMember": 3, "queue": "research", "minResources": {"cpu": "3"}}})
    store.create({"apiVersion": "bus.volcano.sh/v1alpha1", "kind": "Command", "metadata": {"name": "abort", "namespace": "team-a"},
                  "action": "AbortJob", "target": {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "mpi", "uid": "x"}})


# ----------------------------------------------------------------------------- rejected with 422 naming the field
def _cq(**spec):
    return {"apiVersion": KQ, "kind": "ClusterQueue", "metadata": {"name": "bad"}, "spec": spec}


def test_wrong_type(store):
    e = expect_invalid(lambda: store.create(_cq(cohortName=5)), "spec.cohortName", "FieldValueTypeInvalid")
    assert e.message.startswith('ClusterQueue.kueue.x-k8s.io "bad" is invalid: spec.cohortName: Invalid value')
    assert e.details["kind"] == "ClusterQueue" and e.details["group"] == "kueue.x-k8s.io"


def test_missing_required(store):
    bad = {"coveredResources": ["cpu"], "flavors": [{"resources": [{"name": "cpu", "nominalQuota": 1}]}]}
    e = expect_invalid(lambda: store.create(_cq(resourceGroups=[bad])), "spec.resourceGroups[0].flavors[0].name", "FieldValueRequired")
    assert "Required value" in e.message
    expect_invalid(lambda: store.create({"apiVersion": KQ, "kind": "WorkloadPriorityClass", "metadata": {"name": "x"}}),
                   "value", "FieldValueRequired")


def test_bad_enum(store):
    e = expect_invalid(lambda: store.create(_cq(queueingStrategy="Random")), "spec.queueingStrategy", "FieldValueNotSupported")
    assert 'Unsupported value: "Random": supported values: "StrictFIFO", "BestEffortFIFO"' in e.message


def test_bad_quantity_pattern(store):
    rg = {"coveredResources": ["cpu"], "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": "lots"}]}]}
    e = expect_invalid(lambda: store.create(_cq(resourceGroups=[rg])), "spec.resourceGroups[0].flavors[0].resources[0].nominalQuota", "FieldValueInvalid")
    assert "should match" in e.message


def test_several_errors_listed(store):
    e = expect_invalid(lambda: store.create(_cq(queueingStrategy="X", stopPolicy="Y")), "spec.stopPolicy")
    assert e.message.count("Unsupported value") == 2 and ": [" in e.message


def test_cel_rules(store):
    rg = {"coveredResources": ["cpu", "memory"], "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": 1}]}]}
    e = expect_invalid(lambda: store.create(_cq(resourceGroups=[rg])), "spec.resourceGroups[0]")
    assert "flavors must have the same number of resources as the coveredResources" in e.message
    rg2 = {"coveredResources": ["cpu"], "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": 1, "borrowingLimit": 1}]}]}
    expect_invalid(lambda: store.create(_cq(resourceGroups=[rg2])), "spec")


def test_localqueue_cluster_queue_immutable(store):
    lq = store.create({"apiVersion": KQ, "kind": "LocalQueue", "metadata": {"name": "q", "namespace": "team-a"}, "spec": {"clusterQueue": "a"}})
    lq["spec"]["clusterQueue"] = "b"
    e = expect_invalid(lambda: store.update(lq), "spec.clusterQueue", "FieldValueInvalid")
    assert "field is immutable" in e.message
    # other fields may change
    lq["spec"]["clusterQueue"] = "a"
    lq["spec"]["stopPolicy"] = "Hold"
    assert store.update(lq)["spec"]["stopPolicy"] == "Hold"


def test_unknown_fields_strict_warn_ignore(store):
    obj = _cq(bogus=1)
    with pytest.raises(ApiError) as ei:
        store.create(obj)
    assert ei.value.code == 400 and 'unknown field "spec.bogus"' in ei.value.message
    assert ei.value.causes[0]["field"] == "spec.bogus"
    warnings = []
    out = store.create(_cq(bogus=1), field_validation="Warn", warnings=warnings)
    assert warnings == ['unknown field "spec.bogus"'] and "bogus" not in out["spec"]
    store.delete(KQ, "ClusterQueue", "bad")
    warnings = []
    out = store.create(_cq(bogus=1), field_validation="Ignore", warnings=warnings)
    assert warnings == [] and "bogus" not in out["spec"]
    with pytest.raises(ApiError) as ei:  # unknown metadata field too
        store.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "team-a", "labelz": {}}})
    assert 'unknown field "metadata.labelz"' in ei.value.message


def test_unknown_fields_builtin(store):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
           "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicyy": "Always"}]}}
    with pytest.raises(ApiError) as ei:
        store.create(pod)
    assert ei.value.code == 400 and 'unknown field "spec.containers[0].imagePullPolicyy"' in ei.value.message
    w = []
    out = store.create(pod, field_validation="Warn", warnings=w)
    assert w and "imagePullPolicyy" not in out["spec"]["containers"][0]


def test_builtin_checks(store):
    ns = "team-a"
    expect_invalid(lambda: store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns}, "spec": {"containers": []}}),
                   "spec.containers", "FieldValueRequired")
    expect_invalid(lambda: store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
                                         "spec": {"containers": [{"name": "Bad_Name", "image": "i"}]}}), "spec.containers[0].name")
    expect_invalid(lambda: store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
                                         "spec": {"containers": [{"name": "c"}]}}), "spec.containers[0].image", "FieldValueRequired")
    expect_invalid(lambda: store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
                                         "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": "lots"}}}]}}),
                   "spec.containers[0].resources.limits[cpu]")
    expect_invalid(lambda: store.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": ns}, "spec": {}}),
                   "spec.template", "FieldValueRequired")
    expect_invalid(lambda: store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": ns},
                                         "spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
                   "spec.selector", "FieldValueRequired")
    expect_invalid(lambda: store.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": ns}, "spec": {}}),
                   "spec.ports", "FieldValueRequired")
    expect_invalid(lambda: store.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad", "namespace": ns}}),
                   "metadata.name", "FieldValueInvalid")
    expect_invalid(lambda: store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a.b"}}), "metadata.name")
    expect_invalid(lambda: store.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns, "labels": {"a": "b c"}}}),
                   "metadata.labels")


def test_builtin_defaults(store):
    ns = "team-a"
    pod = store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
                        "spec": {"containers": [{"name": "c", "image": "img:1", "ports": [{"containerPort": 80}],
                                                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}})
    sp = pod["spec"]
    assert sp["restartPolicy"] == "Always" and sp["dnsPolicy"] == "ClusterFirst" and sp["schedulerName"] == "default-scheduler"
    assert sp["terminationGracePeriodSeconds"] == 30 and sp["containers"][0]["ports"][0]["protocol"] == "TCP"
    assert sp["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert pod["status"]["phase"] == "Pending" and pod["status"]["qosClass"] == "Guaranteed"
    job = store.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": ns},
                        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}})
    js = job["spec"]
    assert (js["backoffLimit"], js["completions"], js["parallelism"], js["completionMode"], js["suspend"]) == (6, 1, 1, "NonIndexed", False)
    uid = job["metadata"]["uid"]
    assert js["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert js["template"]["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == uid
    dep = store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": ns},
                        "spec": {"selector": {"matchLabels": {"app": "d"}},
                                 "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    sts = store.create({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "namespace": ns},
                        "spec": {"serviceName": "s", "selector": {"matchLabels": {"app": "s"}},
                                 "template": {"metadata": {"labels": {"app": "s"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["podManagementPolicy"] == "OrderedReady"
    svc = store.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc", "namespace": ns},
                        "spec": {"selector": {"app": "d"}, "ports": [{"port": 80}]}})
    assert svc["spec"]["type"] == "ClusterIP" and svc["spec"]["clusterIP"].startswith("10.96.")
    assert svc["spec"]["ports"][0] == {"port": 80, "protocol": "TCP", "targetPort": 80}
    nso = store.get("v1", "Namespace", ns)
    assert nso["status"]["phase"] == "Active" and nso["metadata"]["labels"]["kubernetes.io/metadata.name"] == ns
    pvc = store.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": ns},
                        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}})
    assert pvc["status"]["phase"] == "Bound" and pvc["status"]["capacity"] == {"storage": "10Gi"}


def test_job_selector_immutable(store):
    job = store.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "team-a"},
                        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}})
    job["spec"]["selector"] = {"matchLabels": {"x": "y"}}
    expect_invalid(lambda: store.update(job), "spec.selector")


def test_workload_validation_repeats_cleanly():
    import json

    r = default_registry()
    wl = r.by_kind(KQ, "Workload")
    obj = {"apiVersion": KQ, "kind": "Workload", "metadata": {"name": "w", "namespace": "d"},
           "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 2, "template": {"spec": {
               "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}]}}
    V.validate(wl, json.loads(json.dumps(obj)))
    for _ in range(20):  # the compiled schema is cached and reused; speed is in tests/bench
        res = V.validate(wl, json.loads(json.dumps(obj)))
    assert not res.errors and not res.unknown


def test_summarize_format():
    msg = V.summarize("ClusterQueue.kueue.x-k8s.io", "x", [V.err_required("spec.a"), V.err_invalid("spec.b", 3, "bad")])
    assert msg == 'ClusterQueue.kueue.x-k8s.io "x" is invalid: [spec.a: Required value, spec.b: Invalid value: 3: bad]'
