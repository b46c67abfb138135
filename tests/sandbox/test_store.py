"""In-process tests of the sandbox object store (no HTTP)."""

import json
import re
import threading

import pytest

from sandbox.selectors import match_labels, parse_field_selector, parse_label_selector, selector_to_string
from sandbox.store import ApiError, Store

KQ = "kueue.x-k8s.io/v1beta2"


@pytest.fixture
def store():
    s = Store()
    s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    return s


def cm(name, ns="ns", labels=None, **extra):
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": {"k": "v"}}
    if labels:
        obj["metadata"]["labels"] = labels
    obj["metadata"].update(extra)
    return obj


def lq(name, ns="ns", cq="cq", **meta):
    o = {"apiVersion": KQ, "kind": "LocalQueue", "metadata": {"name": name, "namespace": ns, **meta}, "spec": {"clusterQueue": cq}}
    return o


def raises(code, fn, reason=None):
    with pytest.raises(ApiError) as ei:
        fn()
    assert ei.value.code == code, ei.value.status()
    if reason:
        assert ei.value.reason == reason
    return ei.value


# ----------------------------------------------------------------------------- selectors
def test_label_selector_parsing():
    labels = {"a": "1", "b": "x", "env": "prod"}
    for sel, ok in [("a=1", True), ("a==1", True), ("a!=1", False), ("a!=2", True), ("b in (x,y)", True),
                    ("b notin (x,y)", False), ("c notin (x)", True), ("env", True), ("!env", False), ("!c", True),
                    ("a=1,b in (y)", False), ("a>0", True), ("a<1", False), ("", True)]:
        assert parse_label_selector(sel).matches(labels) is ok, sel
    for bad in ("a in (x", "a=b c", "in in", "a=,=b"):
        with pytest.raises(ValueError):
            parse_label_selector(bad)
    assert match_labels({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "In", "values": ["x"]}]}, labels)
    assert match_labels({}, labels) and not match_labels(None, labels)
    assert not match_labels({"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]}, labels)
    assert selector_to_string({"matchLabels": {"b": "2", "a": "1"}}) == "a=1,b=2"
    assert parse_field_selector("metadata.name=x,status.phase!=Running") == [("metadata.name", "=", "x"), ("status.phase", "!=", "Running")]


# ----------------------------------------------------------------------------- create / get
def test_create_system_fields(store):
    out = store.create(cm("a"))
    m = out["metadata"]
    assert re.match(r"^[0-9a-f-]{36}$", m["uid"])
    assert m["resourceVersion"].isdigit() and int(m["resourceVersion"]) == int(store.resource_version())
    assert m["generation"] == 1
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", m["creationTimestamp"])
    assert out["apiVersion"] == "v1" and out["kind"] == "ConfigMap"
    got = store.get("v1", "ConfigMap", "a", "ns")
    assert got == out
    got["data"]["k"] = "changed"  # copies, not references
    assert store.get("v1", "ConfigMap", "a", "ns")["data"]["k"] == "v"
    out2 = store.create(cm("b"))
    assert int(out2["metadata"]["resourceVersion"]) == int(m["resourceVersion"]) + 1


def test_generate_name(store):
    o = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "job-", "namespace": "ns"}}
    out = store.create(o)
    assert re.match(r"^job-[a-z0-9]{5}$", out["metadata"]["name"])
    assert store.create(o)["metadata"]["name"] != out["metadata"]["name"]


def test_create_errors(store):
    e = raises(409, lambda: (store.create(cm("a")), store.create(cm("a"))), "AlreadyExists")
    assert e.message == 'configmaps "a" already exists'
    e = raises(404, lambda: store.create(cm("a", ns="missing")), "NotFound")
    assert e.message == 'namespaces "missing" not found'
    raises(422, lambda: store.create(cm("Bad_Name")), "Invalid")
    raises(422, lambda: store.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": "ns"}}), "Invalid")
    raises(422, lambda: store.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a.b", "namespace": "ns"},
                                      "spec": {"ports": [{"port": 1}]}}), "Invalid")
    raises(404, lambda: store.create({"apiVersion": "v9", "kind": "Nope", "metadata": {"name": "x"}}))
    # cluster-scoped: namespace ignored
    out = store.create({"apiVersion": KQ, "kind": "ResourceFlavor", "metadata": {"name": "f", "namespace": "ns"}, "spec": {}})
    assert "namespace" not in out["metadata"]


def test_not_found_details(store):
    e = raises(404, lambda: store.get(KQ, "ClusterQueue", "x"), "NotFound")
    assert e.message == 'clusterqueues.kueue.x-k8s.io "x" not found'
    assert e.details == {"name": "x", "group": "kueue.x-k8s.io", "kind": "clusterqueues"}
    st = e.status()
    assert st["kind"] == "Status" and st["status"] == "Failure" and st["code"] == 404 and st["reason"] == "NotFound"
    e = raises(404, lambda: store.get("v1", "Pod", "p", "ns"))
    assert e.message == 'pods "p" not found' and e.details["group"] == ""


# ----------------------------------------------------------------------------- update
def test_update_conflict_and_generation(store):
    o = store.create(lq("q"))
    o["spec"]["stopPolicy"] = "Hold"
    u = store.update(o)
    assert u["metadata"]["generation"] == 2 and int(u["metadata"]["resourceVersion"]) > int(o["metadata"]["resourceVersion"])
    e = raises(409, lambda: store.update(o), "Conflict")
    assert e.message == ('Operation cannot be fulfilled on localqueues.kueue.x-k8s.io "q": the object has been modified; '
                         "please apply your changes to the latest version and try again")
    # label-only change: no generation bump
    u["metadata"]["labels"] = {"a": "b"}
    u2 = store.update(u)
    assert u2["metadata"]["generation"] == 2
    # no-op update keeps the resourceVersion
    u3 = store.update(u2)
    assert u3["metadata"]["resourceVersion"] == u2["metadata"]["resourceVersion"]
    # CRDs require a resourceVersion on update
    del u3["metadata"]["resourceVersion"]
    raises(422, lambda: store.update(u3))
    # built-ins allow unconditional update
    c = store.create(cm("c"))
    del c["metadata"]["resourceVersion"]
    c["data"] = {"x": "y"}
    assert store.update(c)["data"] == {"x": "y"}
    raises(404, lambda: store.update(cm("zzz")))


def test_status_subresource(store):
    o = store.create(dict(lq("q"), status={"pendingWorkloads": 5}))
    assert "pendingWorkloads" not in o.get("status", {})  # status dropped on create
    o["status"] = {"pendingWorkloads": 1}
    o["spec"]["stopPolicy"] = "Hold"
    u = store.update(o)
    assert u["spec"]["stopPolicy"] == "Hold" and "pendingWorkloads" not in (u.get("status") or {})
    u["status"] = {"pendingWorkloads": 2}
    u["spec"]["stopPolicy"] = "None"
    u["metadata"]["labels"] = {"ignored": "yes"}
    s = store.update(u, subresource="status")
    assert s["status"]["pendingWorkloads"] == 2 and s["spec"]["stopPolicy"] == "Hold"
    assert "labels" not in s["metadata"] and s["metadata"]["generation"] == 2
    # merge patch on /status
    p = store.patch(KQ, "LocalQueue", "q", "ns", {"status": {"admittedWorkloads": 1}}, "merge", subresource="status")
    assert p["status"] == {"pendingWorkloads": 2, "admittedWorkloads": 1}
    # kinds without a status subresource store status with the object
    pg = store.create({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "pg", "namespace": "ns"},
                       "spec": {"minMember": 1}, "status": {"phase": "Pending"}})
    assert pg["status"]["phase"] == "Pending"
    raises(404, lambda: store.update(pg, subresource="status"))


def test_scale_subresource(store):
    store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}},
                           "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    sc = store.get_scale("apps/v1", "Deployment", "d", "ns")
    assert sc["kind"] == "Scale" and sc["spec"]["replicas"] == 2 and sc["status"]["selector"] == "app=d"
    out = store.patch("apps/v1", "Deployment", "d", "ns", {"spec": {"replicas": 5}}, "merge", subresource="scale")
    assert out["spec"]["replicas"] == 5
    assert store.get("apps/v1", "Deployment", "d", "ns")["spec"]["replicas"] == 5


# ----------------------------------------------------------------------------- list
def test_list_selectors_and_pagination(store):
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    for i in range(7):
        store.create(cm(f"c{i}", labels={"i": str(i), "even": str(i % 2 == 0).lower()}))
    store.create(cm("z", ns="other", labels={"even": "true"}))
    lst = store.list("v1", "ConfigMap", "ns")
    assert lst["kind"] == "ConfigMapList" and lst["apiVersion"] == "v1" and lst["metadata"]["resourceVersion"] == store.resource_version()
    assert [o["metadata"]["name"] for o in lst["items"]] == [f"c{i}" for i in range(7)]
    assert len(store.list("v1", "ConfigMap")["items"]) == 8
    assert [o["metadata"]["name"] for o in store.list("v1", "ConfigMap", label_selector="even=true")["items"]] == ["c0", "c2", "c4", "c6", "z"]
    assert len(store.list("v1", "ConfigMap", "ns", label_selector="i in (1,2),even!=true")["items"]) == 1
    assert [o["metadata"]["name"] for o in store.list("v1", "ConfigMap", field_selector="metadata.name=c3")["items"]] == ["c3"]
    assert len(store.list("v1", "ConfigMap", field_selector="metadata.namespace=other")["items"]) == 1
    raises(400, lambda: store.list("v1", "ConfigMap", field_selector="data.k=v"), "BadRequest")
    raises(400, lambda: store.list("v1", "ConfigMap", label_selector="a in (b"), "BadRequest")
    assert store.list(KQ, "ClusterQueue")["items"] == []
    names, token, pages = [], None, 0
    while True:
        page = store.list("v1", "ConfigMap", "ns", limit=3, continue_token=token)
        pages += 1
        names += [o["metadata"]["name"] for o in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
        assert page["metadata"]["remainingItemCount"] > 0
    assert names == [f"c{i}" for i in range(7)] and pages == 3
    raises(400, lambda: store.list("v1", "ConfigMap", continue_token="!!!"))


def test_pod_field_selectors(store):
    for name, node in (("a", "n1"), ("b", "n2")):
        store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
                      "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
    assert [p["metadata"]["name"] for p in store.list("v1", "Pod", field_selector="spec.nodeName=n2")["items"]] == ["b"]
    assert len(store.list("v1", "Pod", field_selector="status.phase=Pending")["items"]) == 2
    assert len(store.list("v1", "Pod", field_selector="status.phase!=Pending")["items"]) == 0


# ----------------------------------------------------------------------------- dry run
def test_dry_run_stores_nothing(store):
    events = []
    store.subscribe(lambda t, o: events.append(t))
    rv = store.resource_version()
    out = store.create(cm("d"), dry_run=True)
    assert out["metadata"]["name"] == "d" and out["metadata"]["uid"]
    raises(404, lambda: store.get("v1", "ConfigMap", "d", "ns"))
    raises(422, lambda: store.create(cm("BAD"), dry_run=True))
    store.create(cm("e"))
    rv = store.resource_version()
    out = store.patch("v1", "ConfigMap", "e", "ns", {"data": {"x": "1"}}, "merge", dry_run=True)
    assert out["data"]["x"] == "1" and "x" not in store.get("v1", "ConfigMap", "e", "ns")["data"]
    store.delete("v1", "ConfigMap", "e", "ns", dry_run=True)
    assert store.get("v1", "ConfigMap", "e", "ns") and store.resource_version() == rv
    assert events == ["ADDED"]


# ----------------------------------------------------------------------------- delete / finalizers / GC
def test_delete_finalizers(store):
    store.create(cm("f", finalizers=["example.com/hold"]))
    out = store.delete("v1", "ConfigMap", "f", "ns")
    assert out["metadata"]["deletionTimestamp"] and out["metadata"]["deletionGracePeriodSeconds"] == 0
    cur = store.get("v1", "ConfigMap", "f", "ns")
    cur["metadata"]["finalizers"].append("another")
    raises(422, lambda: store.update(cur))
    cur = store.get("v1", "ConfigMap", "f", "ns")
    cur["metadata"]["finalizers"] = []
    store.update(cur)
    raises(404, lambda: store.get("v1", "ConfigMap", "f", "ns"))


def test_delete_preconditions(store):
    o = store.create(cm("p"))
    raises(409, lambda: store.delete("v1", "ConfigMap", "p", "ns", preconditions={"uid": "nope"}), "Conflict")
    raises(409, lambda: store.delete("v1", "ConfigMap", "p", "ns", preconditions={"resourceVersion": "1"}), "Conflict")
    store.delete("v1", "ConfigMap", "p", "ns", preconditions={"uid": o["metadata"]["uid"]})
    raises(404, lambda: store.delete("v1", "ConfigMap", "p", "ns"), "NotFound")


def _owned(owner, name, kind="ConfigMap", **meta):
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    return cm(name, ownerReferences=[ref], **meta)


def test_gc_background(store):
    owner = store.create(cm("owner"))
    store.create(_owned(owner, "dep1"))
    store.create(_owned(owner, "dep2", finalizers=["x/y"]))
    other = store.create(cm("other-owner"))
    two = _owned(owner, "dep3")
    two["metadata"]["ownerReferences"].append({"apiVersion": "v1", "kind": "ConfigMap", "name": "other-owner", "uid": other["metadata"]["uid"]})
    store.create(two)
    store.delete("v1", "ConfigMap", "owner", "ns")
    names = {o["metadata"]["name"] for o in store.list("v1", "ConfigMap", "ns")["items"]}
    assert names == {"dep2", "other-owner", "dep3"}
    assert store.get("v1", "ConfigMap", "dep2", "ns")["metadata"]["deletionTimestamp"]
    d3 = store.get("v1", "ConfigMap", "dep3", "ns")
    assert [r["name"] for r in d3["metadata"]["ownerReferences"]] == ["other-owner"]


def test_gc_foreground(store):
    owner = store.create(cm("owner"))
    store.create(_owned(owner, "dep", finalizers=["x/y"]))
    out = store.delete("v1", "ConfigMap", "owner", "ns", propagation_policy="Foreground")
    assert "foregroundDeletion" in out["metadata"]["finalizers"] and out["metadata"]["deletionTimestamp"]
    assert store.get("v1", "ConfigMap", "owner", "ns")
    dep = store.get("v1", "ConfigMap", "dep", "ns")
    assert dep["metadata"]["deletionTimestamp"]
    dep["metadata"]["finalizers"] = []
    store.update(dep)
    raises(404, lambda: store.get("v1", "ConfigMap", "dep", "ns"))
    raises(404, lambda: store.get("v1", "ConfigMap", "owner", "ns"))
    # foreground without dependents deletes at once
    store.create(cm("lonely"))
    store.delete("v1", "ConfigMap", "lonely", "ns", propagation_policy="Foreground")
    raises(404, lambda: store.get("v1", "ConfigMap", "lonely", "ns"))


def test_gc_orphan(store):
    owner = store.create(cm("owner"))
    store.create(_owned(owner, "dep"))
    store.delete("v1", "ConfigMap", "owner", "ns", propagation_policy="Orphan")
    dep = store.get("v1", "ConfigMap", "dep", "ns")
    assert "ownerReferences" not in dep["metadata"]


def test_gc_across_kinds_job_pods(store):
    job = store.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
                        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}})
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": job["metadata"]["uid"], "controller": True}
    for i in range(3):
        store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"j-{i}", "namespace": "ns", "ownerReferences": [ref]},
                      "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}})
    store.delete("batch/v1", "Job", "j", "ns", propagation_policy="Background")
    assert store.list("v1", "Pod", "ns")["items"] == []


def test_namespace_deletion(store):
    store.create(cm("a"))
    store.create(cm("held", finalizers=["x/y"]))
    store.create(lq("q"))
    out = store.delete("v1", "Namespace", "ns")
    assert out["status"]["phase"] == "Terminating" and out["metadata"]["deletionTimestamp"]
    assert store.get("v1", "Namespace", "ns")["status"]["phase"] == "Terminating"
    e = raises(403, lambda: store.create(cm("new")), "Forbidden")
    assert "because it is being terminated" in e.message
    assert [o["metadata"]["name"] for o in store.list("v1", "ConfigMap", "ns")["items"]] == ["held"]
    assert store.list(KQ, "LocalQueue", "ns")["items"] == []
    held = store.get("v1", "ConfigMap", "held", "ns")
    held["metadata"]["finalizers"] = []
    store.update(held)
    raises(404, lambda: store.get("v1", "Namespace", "ns"))
    # empty namespace goes at once
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "empty"}})
    store.delete("v1", "Namespace", "empty")
    raises(404, lambda: store.get("v1", "Namespace", "empty"))


def test_delete_collection(store):
    for i in range(4):
        store.create(cm(f"c{i}", labels={"grp": "a" if i < 2 else "b"}))
    out = store.delete_collection("v1", "ConfigMap", "ns", label_selector="grp=a")
    assert out["kind"] == "ConfigMapList" and len(out["items"]) == 2
    assert [o["metadata"]["name"] for o in store.list("v1", "ConfigMap", "ns")["items"]] == ["c2", "c3"]


# ----------------------------------------------------------------------------- watch
def drain(w, timeout=0.05):
    out = []
    while True:
        ev = w.next(timeout)
        if ev is None:
            return out
        out.append((ev[0], ev[1]["metadata"]["name"]))


def test_watch_initial_and_live(store):
    store.create(cm("a"))
    w = store.watch("v1", "ConfigMap", "ns")
    assert drain(w) == [("ADDED", "a")]
    o = store.create(cm("b"))
    o["data"] = {"z": "1"}
    store.update(o)
    store.delete("v1", "ConfigMap", "a", "ns")
    evs = []
    while len(evs) < 3:
        t, obj = w.next(1)
        evs.append((t, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))
    assert [(t, n) for t, n, _ in evs] == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]
    assert int(evs[2][2]) == int(store.resource_version())  # DELETED carries a new resourceVersion
    w.close()
    assert w.next(0.01) is None


def test_watch_resume_and_expired():
    s = Store(history=5)
    s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    rv0 = s.resource_version()
    s.create(cm("a"))
    s.create(cm("b"))
    w = s.watch("v1", "ConfigMap", "ns", resource_version=rv0)
    assert drain(w) == [("ADDED", "a"), ("ADDED", "b")]
    w2 = s.watch("v1", "ConfigMap", "ns", resource_version=s.resource_version())
    assert drain(w2) == []
    for i in range(10):
        s.create(cm(f"x{i}"))
    e = raises(410, lambda: s.watch("v1", "ConfigMap", "ns", resource_version=rv0), "Expired")
    assert re.match(r"^too old resource version: \d+ \(\d+\)$", e.message)


def test_watch_selectors(store):
    store.create(cm("a", labels={"app": "x"}))
    w = store.watch("v1", "ConfigMap", "ns", label_selector="app=x")
    wf = store.watch("v1", "ConfigMap", field_selector="metadata.name=b")
    assert drain(w) == [("ADDED", "a")]
    assert drain(wf) == []
    b = store.create(cm("b"))
    b["metadata"]["labels"] = {"app": "x"}
    b = store.update(b)
    b["metadata"]["labels"] = {"app": "y"}
    store.update(b)
    assert drain(w) == [("ADDED", "b"), ("DELETED", "b")]
    assert [t for t, _ in drain(wf)] == ["ADDED", "MODIFIED", "MODIFIED"]


def test_watch_namespace_and_kind_isolation(store):
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    w = store.watch("v1", "ConfigMap", "ns", resource_version=store.resource_version())
    store.create(cm("x", ns="other"))
    store.create(lq("q"))
    store.create(cm("y"))
    assert drain(w) == [("ADDED", "y")]
    assert w.bookmark()["metadata"]["resourceVersion"] == store.resource_version()


def test_watch_threaded_delivery(store):
    w = store.watch("v1", "ConfigMap", "ns", resource_version=store.resource_version())
    got = []

    def reader():
        while len(got) < 50:
            ev = w.next(2)
            if ev is None:
                break
            got.append(ev[1]["metadata"]["name"])

    t = threading.Thread(target=reader)
    t.start()
    for i in range(50):
        store.create(cm(f"t{i}"))
    t.join(5)
    assert got == [f"t{i}" for i in range(50)]


# ----------------------------------------------------------------------------- subscribe
def test_subscribe_after_commit_in_order(store):
    seen = []

    def cb(t, obj):
        # called outside the store lock: another thread can write
        done = threading.Event()
        threading.Thread(target=lambda: (store.list("v1", "ConfigMap"), done.set())).start()
        assert done.wait(2)
        seen.append((t, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))

    store.subscribe(cb)
    o = store.create(cm("a"))
    o["data"] = {"b": "c"}
    store.update(o)
    store.delete("v1", "ConfigMap", "a", "ns")
    assert [(t, n) for t, n, _ in seen] == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    rvs = [int(r) for _, _, r in seen]
    assert rvs == sorted(rvs)


def test_lock_is_reentrant_for_controllers(store):
    seen = []
    store.subscribe(lambda t, o: seen.append(t))
    with store.lock:
        store.create(cm("a"))
        store.create(cm("b"))
    assert seen == ["ADDED", "ADDED"]


# ----------------------------------------------------------------------------- dump / load
def test_dump_load_roundtrip(store):
    owner = store.create(cm("owner"))
    store.create(_owned(owner, "dep"))
    store.create(lq("q"))
    data = json.loads(json.dumps(store.dump()))
    s2 = Store()
    s2.load(data)
    assert s2.resource_version() == store.resource_version()
    assert s2.get(KQ, "LocalQueue", "q", "ns") == store.get(KQ, "LocalQueue", "q", "ns")
    w = s2.watch("v1", "ConfigMap", "ns", resource_version=s2.resource_version())
    s2.delete("v1", "ConfigMap", "owner", "ns")  # GC index rebuilt
    raises(404, lambda: s2.get("v1", "ConfigMap", "dep", "ns"))
    assert sorted(drain(w)) == [("DELETED", "dep"), ("DELETED", "owner")]
    raises(410, lambda: s2.watch("v1", "ConfigMap", "ns", resource_version="1"))
    n = s2.create(cm("new"))
    assert int(n["metadata"]["resourceVersion"]) > int(store.resource_version())


# ----------------------------------------------------------------------------- concurrency & throughput
def test_concurrent_writers(store):
    errs = []

    def writer(k):
        try:
            for i in range(100):
                store.create(cm(f"w{k}-{i}"))
        except Exception as e:  # pragma: no cover
            errs.append(e)

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errs
    items = store.list("v1", "ConfigMap", "ns")["items"]
    assert len(items) == 400
    assert len({o["metadata"]["resourceVersion"] for o in items}) == 400
