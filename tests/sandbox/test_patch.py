"""Patch algorithms (JSON, merge, strategic) and server-side apply, unit-level and through the store."""

import pytest

from sandbox import validation as V
from sandbox.patch import (
    PatchError,
    decode_fields,
    encode_fields,
    field_set,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from sandbox.registry import default_registry
from sandbox.store import ApiError, Store

KQ = "kueue.x-k8s.io/v1beta2"


@pytest.fixture
def store():
    s = Store()
    s.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    return s


# ----------------------------------------------------------------------------- JSON patch
def test_json_patch_ops():
    doc = {"a": {"b": [1, 2]}, "c": "x"}
    out = json_patch(doc, [
        {"op": "add", "path": "/a/b/-", "value": 3},
        {"op": "add", "path": "/a/b/0", "value": 0},
        {"op": "replace", "path": "/c", "value": "y"},
        {"op": "copy", "from": "/c", "path": "/d"},
        {"op": "move", "from": "/d", "path": "/e"},
        {"op": "remove", "path": "/a/b/1"},
        {"op": "test", "path": "/e", "value": "y"},
        {"op": "add", "path": "/f~1g", "value": {"h": 1}},
    ])
    assert out == {"a": {"b": [0, 2, 3]}, "c": "y", "e": "y", "f/g": {"h": 1}}
    assert doc == {"a": {"b": [1, 2]}, "c": "x"}  # input untouched


def test_json_patch_errors():
    with pytest.raises(PatchError):
        json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])
    with pytest.raises(PatchError):
        json_patch({"a": 1}, [{"op": "remove", "path": "/b"}])
    with pytest.raises(PatchError):
        json_patch({"a": 1}, [{"op": "replace", "path": "/b", "value": 1}])
    with pytest.raises(PatchError) as ei:
        json_patch({}, [{"op": "frob", "path": "/a"}])
    assert ei.value.code == 400


# ----------------------------------------------------------------------------- merge patch
def test_merge_patch_rfc7386():
    assert merge_patch({"a": "b"}, {"a": "c"}) == {"a": "c"}
    assert merge_patch({"a": "b"}, {"b": "c"}) == {"a": "b", "b": "c"}
    assert merge_patch({"a": "b"}, {"a": None}) == {}
    assert merge_patch({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}) == {"a": {"b": "d"}}
    assert merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert merge_patch({"a": "foo"}, "bar") == "bar"
    assert merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}


# ----------------------------------------------------------------------------- strategic merge
def _pod_node():
    return V.schema_for(default_registry().by_kind("v1", "Pod"))


def test_strategic_merge_containers_by_name():
    pod = {"spec": {"containers": [{"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
                                   {"name": "b", "image": "b:1"}]}}
    out = strategic_merge_patch(pod, {"spec": {"containers": [{"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]}]}}, _pod_node())
    a = out["spec"]["containers"][0]
    assert a["image"] == "a:2" and a["env"] == [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]
    assert out["spec"]["containers"][1] == {"name": "b", "image": "b:1"}
    # $patch: delete on an item
    out2 = strategic_merge_patch(out, {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}}, _pod_node())
    assert [c["name"] for c in out2["spec"]["containers"]] == ["a"]
    # $patch: replace on a map
    out3 = strategic_merge_patch(out, {"spec": {"$patch": "replace", "containers": [{"name": "z", "image": "z"}]}}, _pod_node())
    assert out3["spec"] == {"containers": [{"name": "z", "image": "z"}]}
    # null deletes a key; non-merge lists are replaced
    out4 = strategic_merge_patch({"spec": {"nodeSelector": {"a": "b"}, "containers": [{"name": "a", "args": ["x", "y"]}]}},
                                 {"spec": {"nodeSelector": None, "containers": [{"name": "a", "args": ["z"]}]}}, _pod_node())
    assert "nodeSelector" not in out4["spec"] and out4["spec"]["containers"][0]["args"] == ["z"]


def test_strategic_merge_ports_and_directives():
    pod = {"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "name": "http"}]}]}}
    out = strategic_merge_patch(pod, {"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 443, "name": "https"}]}]}}, _pod_node())
    assert [p["containerPort"] for p in out["spec"]["containers"][0]["ports"]] == [80, 443]
    # kubectl's three-way patches carry $setElementOrder
    out2 = strategic_merge_patch(out, {"spec": {"$setElementOrder/containers": [{"name": "a"}],
                                                "containers": [{"name": "a", "image": "n"}]}}, _pod_node())
    assert out2["spec"]["containers"][0]["image"] == "n"
    meta = strategic_merge_patch({"metadata": {"finalizers": ["a"]}}, {"metadata": {"finalizers": ["b"]}}, _pod_node())
    assert meta["metadata"]["finalizers"] == ["a", "b"]
    meta2 = strategic_merge_patch(meta, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, _pod_node())
    assert meta2["metadata"]["finalizers"] == ["b"]


def test_strategic_merge_service_ports():
    node = V.schema_for(default_registry().by_kind("v1", "Service"))
    svc = {"spec": {"ports": [{"port": 80, "name": "a"}]}}
    out = strategic_merge_patch(svc, {"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 81, "name": "b"}]}}, node)
    assert out["spec"]["ports"] == [{"port": 80, "name": "a", "targetPort": 8080}, {"port": 81, "name": "b"}]


# ----------------------------------------------------------------------------- field sets
def test_field_set_roundtrip():
    node = _pod_node()
    obj = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}], "nodeSelector": {}}}
    fs = field_set(obj, node)
    assert ("f:metadata", "f:labels", "f:a") in fs
    assert ("f:spec", "f:containers", 'k:{"name":"c"}', "f:image") in fs
    assert ("f:spec", "f:nodeSelector") in fs
    assert decode_fields(encode_fields(fs)) == fs
    enc = encode_fields(fs)
    assert enc["f:spec"]["f:containers"]['k:{"name":"c"}']["."] == {}


# ----------------------------------------------------------------------------- through the store
def test_store_json_patch_and_test_op(store):
    cm = store.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}})
    rv = cm["metadata"]["resourceVersion"]
    out = store.patch("v1", "ConfigMap", "c", "ns", [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                                                     {"op": "add", "path": "/data/b", "value": "2"}], "json")
    assert out["data"] == {"a": "1", "b": "2"}
    with pytest.raises(ApiError) as ei:
        store.patch("v1", "ConfigMap", "c", "ns", [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}], "json")
    assert ei.value.code == 422


def test_store_merge_patch(store):
    store.create({"apiVersion": KQ, "kind": "LocalQueue", "metadata": {"name": "q", "namespace": "ns", "labels": {"a": "b"}},
                  "spec": {"clusterQueue": "cq"}})
    out = store.patch(KQ, "LocalQueue", "q", "ns", {"metadata": {"labels": {"a": None, "c": "d"}}, "spec": {"stopPolicy": "Hold"}},
                      "merge", field_manager="kubectl-label")
    assert out["metadata"]["labels"] == {"c": "d"} and out["spec"]["stopPolicy"] == "Hold"
    assert out["metadata"]["generation"] == 2
    assert any(e["manager"] == "kubectl-label" and e["operation"] == "Update" for e in out["metadata"]["managedFields"])
    # stale resourceVersion in a patch -> conflict
    with pytest.raises(ApiError) as ei:
        store.patch(KQ, "LocalQueue", "q", "ns", {"metadata": {"resourceVersion": "1"}, "spec": {"stopPolicy": "None"}}, "merge")
    assert ei.value.code == 409 and ei.value.reason == "Conflict"
    # validation applies to patches
    with pytest.raises(ApiError) as ei:
        store.patch(KQ, "LocalQueue", "q", "ns", {"spec": {"stopPolicy": "Sometimes"}}, "merge")
    assert ei.value.code == 422


def test_store_strategic_patch_builtin_and_415_for_crd(store):
    store.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}})
    out = store.patch("v1", "ConfigMap", "c", "ns", {"data": {"b": "2"}}, "strategic")
    assert out["data"] == {"a": "1", "b": "2"}
    store.create({"apiVersion": KQ, "kind": "ResourceFlavor", "metadata": {"name": "f"}, "spec": {}})
    with pytest.raises(ApiError) as ei:
        store.patch(KQ, "ResourceFlavor", "f", None, {"spec": {}}, "strategic")
    assert ei.value.code == 415 and ei.value.reason == "UnsupportedMediaType"
    assert "application/merge-patch+json" in ei.value.message


def test_store_patch_missing_object(store):
    with pytest.raises(ApiError) as ei:
        store.patch("v1", "ConfigMap", "nope", "ns", {"data": {}}, "merge")
    assert ei.value.code == 404 and ei.value.message == 'configmaps "nope" not found'


# ----------------------------------------------------------------------------- server-side apply
def _cq(spec, name="cq"):
    return {"apiVersion": KQ, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def test_apply_requires_field_manager(store):
    with pytest.raises(ApiError) as ei:
        store.patch(KQ, "ClusterQueue", "cq", None, _cq({}), "apply")
    assert ei.value.code == 400


def test_apply_creates_and_is_idempotent(store):
    a = store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "x", "namespaceSelector": {}}), "apply", field_manager="portal")
    assert a["metadata"]["generation"] == 1 and a["spec"]["cohortName"] == "x"
    mf = a["metadata"]["managedFields"]
    assert mf[0]["manager"] == "portal" and mf[0]["operation"] == "Apply" and mf[0]["fieldsType"] == "FieldsV1"
    assert mf[0]["fieldsV1"] == {"f:spec": {"f:cohortName": {}, "f:namespaceSelector": {}}}
    b = store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "x", "namespaceSelector": {}}), "apply", field_manager="portal")
    assert b["metadata"]["resourceVersion"] == a["metadata"]["resourceVersion"]
    assert b["metadata"]["generation"] == 1
    c = store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "y", "namespaceSelector": {}}), "apply", field_manager="portal")
    assert int(c["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"]) and c["metadata"]["generation"] == 2


def test_apply_conflict_and_force(store):
    store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "x"}), "apply", field_manager="portal")
    with pytest.raises(ApiError) as ei:
        store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "y"}), "apply", field_manager="other")
    e = ei.value
    assert e.code == 409 and e.reason == "Conflict"
    assert e.causes == [{"type": "FieldManagerConflict", "message": f'conflict with "portal" using {KQ}: .spec.cohortName', "field": ".spec.cohortName"}]
    # same value: shared ownership, no conflict
    store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "x"}), "apply", field_manager="third")
    out = store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "y"}), "apply", field_manager="other", force=True)
    assert out["spec"]["cohortName"] == "y"
    owners = {e["manager"] for e in out["metadata"]["managedFields"]}
    assert owners == {"other"}


def test_apply_removes_fields_no_longer_applied(store):
    store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "x", "stopPolicy": "Hold"}), "apply", field_manager="portal")
    store.patch(KQ, "ClusterQueue", "cq", None, _cq({"stopPolicy": "Hold"}), "apply", field_manager="ops")
    out = store.patch(KQ, "ClusterQueue", "cq", None, _cq({}), "apply", field_manager="portal")
    assert "cohortName" not in out["spec"]  # owned only by portal -> removed
    assert out["spec"]["stopPolicy"] == "Hold"  # also owned by ops -> kept


def test_apply_after_update_conflicts_with_update_manager(store):
    store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "x"}), "apply", field_manager="portal")
    store.patch(KQ, "ClusterQueue", "cq", None, {"spec": {"cohortName": "z"}}, "merge", field_manager="kubectl-edit")
    with pytest.raises(ApiError) as ei:
        store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "x"}), "apply", field_manager="portal")
    assert 'conflict with "kubectl-edit"' in ei.value.causes[0]["message"]


def test_apply_map_list_items(store):
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"},
           "spec": {"selector": {"matchLabels": {"app": "d"}},
                    "template": {"metadata": {"labels": {"app": "d"}},
                                 "spec": {"containers": [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]}}}}
    store.patch("apps/v1", "Deployment", "d", "ns", dep, "apply", field_manager="portal")
    dep["spec"]["template"]["spec"]["containers"] = [{"name": "a", "image": "a:2"}]
    out = store.patch("apps/v1", "Deployment", "d", "ns", dep, "apply", field_manager="portal")
    assert [(c["name"], c["image"]) for c in out["spec"]["template"]["spec"]["containers"]] == [("a", "a:2")]


def test_apply_ignores_status_on_main_resource_and_status_apply(store):
    store.patch(KQ, "ClusterQueue", "cq", None, dict(_cq({}), status={"pendingWorkloads": 3}), "apply", field_manager="portal")
    assert "pendingWorkloads" not in store.get(KQ, "ClusterQueue", "cq").get("status", {})
    out = store.patch(KQ, "ClusterQueue", "cq", None, {"apiVersion": KQ, "kind": "ClusterQueue", "metadata": {"name": "cq"},
                                                       "status": {"pendingWorkloads": 2}}, "apply", subresource="status",
                      field_manager="kueue")
    assert out["status"]["pendingWorkloads"] == 2
    assert out["metadata"]["generation"] == 1


def test_apply_dry_run_and_validation(store):
    out = store.patch(KQ, "ClusterQueue", "cq", None, _cq({"cohortName": "x"}), "apply", field_manager="p", dry_run=True)
    assert out["spec"]["cohortName"] == "x"
    with pytest.raises(ApiError):
        store.get(KQ, "ClusterQueue", "cq")
    with pytest.raises(ApiError) as ei:
        store.patch(KQ, "ClusterQueue", "cq", None, _cq({"queueingStrategy": "Nope"}), "apply", field_manager="p")
    assert ei.value.code == 422
    with pytest.raises(ApiError) as ei:
        store.patch(KQ, "ClusterQueue", "cq", None, {"metadata": {"name": "cq"}}, "apply", field_manager="p")
    assert ei.value.code == 400


def test_managed_fields_rewrite_by_client(store):
    cm = store.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}},
                      field_manager="kubectl-client-side-apply")
    assert cm["metadata"]["managedFields"][0]["manager"] == "kubectl-client-side-apply"
    out = store.patch("v1", "ConfigMap", "c", "ns", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": cm["metadata"]["resourceVersion"]},
        {"op": "replace", "path": "/metadata/managedFields", "value": [
            {"manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}}]}],
        "json")
    assert [e["manager"] for e in out["metadata"]["managedFields"]] == ["kubectl"]
