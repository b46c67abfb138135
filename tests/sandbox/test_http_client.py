"""The sandbox cluster through the official ``kubernetes`` Python client, over loopback (no mocks)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from sandbox.testing import api_client, control

KUEUE = ("kueue.x-k8s.io", "v1beta2")


def _uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def ns(sandbox_cluster):
    name = f"t-{_uid()}"
    with api_client(sandbox_cluster) as api:
        client.CoreV1Api(api).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def _reason(e: ApiException) -> str:
    return json.loads(e.body)["reason"]


def test_requests_without_token_get_401(sandbox_cluster, tmp_path):
    status, _, body = control(sandbox_cluster, "GET", "/api/v1/namespaces", token="")
    assert status == 401
    assert body["kind"] == "Status" and body["reason"] == "Unauthorized" and body["code"] == 401
    status, _, body = control(sandbox_cluster, "GET", "/apis", token="wrong-token")
    assert status == 401

    cfg = client.Configuration()
    cfg.host = sandbox_cluster.url
    cfg.ssl_ca_cert = str(tmp_path / "ca.pem")
    (tmp_path / "ca.pem").write_bytes(sandbox_cluster.ca_pem)
    with client.ApiClient(cfg) as api, pytest.raises(ApiException) as exc:
        client.CoreV1Api(api).list_namespace()
    assert exc.value.status == 401
    assert _reason(exc.value) == "Unauthorized"


def test_version_and_discovery(sandbox_cluster):
    with api_client(sandbox_cluster) as api:
        version = client.VersionApi(api).get_code()
        assert version.major == "1" and version.minor == "32"
        groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
        assert groups["kueue.x-k8s.io"].preferred_version.version == "v1beta2"
        core = client.CoreV1Api(api).get_api_resources()
        names = {r.name: r for r in core.resources}
        assert names["pods"].namespaced and "po" in names["pods"].short_names
        assert "pods/log" in names and "pods/status" in names
        assert not names["nodes"].namespaced


def test_core_configmap_crud_and_conflict(sandbox_cluster, ns):
    with api_client(sandbox_cluster) as api:
        v1 = client.CoreV1Api(api)
        cm = v1.create_namespaced_config_map(ns, {"metadata": {"name": "cfg", "labels": {"app": "x"}}, "data": {"a": "1"}})
        assert cm.metadata.name == "cfg" and cm.metadata.resource_version
        got = v1.read_namespaced_config_map("cfg", ns)
        assert got.data == {"a": "1"}
        # strategic merge patch (the client's default for a dict body)
        patched = v1.patch_namespaced_config_map("cfg", ns, {"data": {"b": "2"}})
        assert patched.data == {"a": "1", "b": "2"}
        # PUT with the current resourceVersion works; with the stale one it is a 409 Conflict
        fresh = v1.read_namespaced_config_map("cfg", ns)
        fresh.data["c"] = "3"
        v1.replace_namespaced_config_map("cfg", ns, fresh)
        stale = got
        stale.data = {"z": "9"}
        with pytest.raises(ApiException) as exc:
            v1.replace_namespaced_config_map("cfg", ns, stale)
        assert exc.value.status == 409 and _reason(exc.value) == "Conflict"
        # duplicate create
        with pytest.raises(ApiException) as exc:
            v1.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {}})
        assert exc.value.status == 409 and _reason(exc.value) == "AlreadyExists"
        listed = v1.list_namespaced_config_map(ns, label_selector="app=x")
        assert [i.metadata.name for i in listed.items] == ["cfg"]
        status = v1.delete_namespaced_config_map("cfg", ns)
        status = status if isinstance(status, dict) else status.to_dict()
        assert status["status"] == "Success" and status["details"]["name"] == "cfg"
        with pytest.raises(ApiException) as exc:
            v1.read_namespaced_config_map("cfg", ns)
        assert exc.value.status == 404 and _reason(exc.value) == "NotFound"
        assert json.loads(exc.value.body)["message"] == 'configmaps "cfg" not found'


def test_delete_collection_by_label(sandbox_cluster, ns):
    with api_client(sandbox_cluster) as api:
        v1 = client.CoreV1Api(api)
        for i in range(4):
            v1.create_namespaced_config_map(ns, {"metadata": {"name": f"dc{i}", "labels": {"drop": str(i % 2)}}, "data": {}})
        v1.delete_collection_namespaced_config_map(ns, label_selector="drop=1")
        assert sorted(c.metadata.name for c in v1.list_namespaced_config_map(ns).items) == ["dc0", "dc2"]


def test_dry_run_does_not_persist(sandbox_cluster, ns):
    with api_client(sandbox_cluster) as api:
        v1 = client.CoreV1Api(api)
        v1.create_namespaced_config_map(ns, {"metadata": {"name": "dry"}, "data": {}}, dry_run="All")
        with pytest.raises(ApiException) as exc:
            v1.read_namespaced_config_map("dry", ns)
        assert exc.value.status == 404


def _cq(name: str, **spec) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, **spec}}


def test_custom_objects_crud(sandbox_cluster, ns):
    name = f"cq-{_uid()}"
    with api_client(sandbox_cluster) as api:
        co = client.CustomObjectsApi(api)
        created = co.create_cluster_custom_object(*KUEUE, "clusterqueues", _cq(name, cohortName="team-a"))
        assert created["metadata"]["name"] == name and created["kind"] == "ClusterQueue"
        lq = co.create_namespaced_custom_object(*KUEUE, ns, "localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "main", "labels": {"tier": "gold"}}, "spec": {"clusterQueue": name}})
        assert lq["metadata"]["namespace"] == ns
        items = co.list_namespaced_custom_object(*KUEUE, ns, "localqueues", label_selector="tier=gold")["items"]
        assert [i["metadata"]["name"] for i in items] == ["main"]
        assert co.list_namespaced_custom_object(*KUEUE, ns, "localqueues", label_selector="tier=silver")["items"] == []
        # merge patch
        merged = co.patch_cluster_custom_object(*KUEUE, "clusterqueues", name, {"spec": {"cohortName": "team-b"}},
                                                _content_type="application/merge-patch+json")
        assert merged["spec"]["cohortName"] == "team-b"
        # JSON patch
        jp = co.patch_cluster_custom_object(*KUEUE, "clusterqueues", name,
                                            [{"op": "replace", "path": "/spec/cohortName", "value": "team-c"}],
                                            _content_type="application/json-patch+json")
        assert jp["spec"]["cohortName"] == "team-c"
        # server-side apply of a new object creates it (HTTP 201, which this client method maps to None, as against
        # a real apiserver); applying again updates it (200)
        ssa_name = f"cq-{_uid()}"
        ssa = dict(_content_type="application/apply-patch+yaml", field_manager="portal", force=True)
        co.patch_cluster_custom_object(*KUEUE, "clusterqueues", ssa_name, _cq(ssa_name, cohortName="ssa"), **ssa)
        assert co.get_cluster_custom_object(*KUEUE, "clusterqueues", ssa_name)["spec"]["cohortName"] == "ssa"
        applied = co.patch_cluster_custom_object(*KUEUE, "clusterqueues", ssa_name, _cq(ssa_name, cohortName="ssa2"), **ssa)
        assert applied["spec"]["cohortName"] == "ssa2"
        # strategic merge patch on a custom resource is refused like a real apiserver does
        with pytest.raises(ApiException) as exc:
            co.patch_cluster_custom_object(*KUEUE, "clusterqueues", name, {"spec": {"cohortName": "smp"}},
                                           _content_type="application/strategic-merge-patch+json")
        assert exc.value.status == 415
        co.delete_cluster_custom_object(*KUEUE, "clusterqueues", ssa_name)
        co.delete_namespaced_custom_object(*KUEUE, ns, "localqueues", "main", propagation_policy="Background")
        co.delete_cluster_custom_object(*KUEUE, "clusterqueues", name, body={"propagationPolicy": "Background"})
        # Kueue's resource-in-use finalizer: the (unused) ClusterQueue goes on the controller's next pass, not at once
        with pytest.raises(ApiException) as exc:
            for _ in range(100):
                co.get_cluster_custom_object(*KUEUE, "clusterqueues", name)
                time.sleep(0.05)
        assert exc.value.status == 404
        body = json.loads(exc.value.body)
        assert body["message"] == f'clusterqueues.kueue.x-k8s.io "{name}" not found'
        assert body["details"]["kind"] == "clusterqueues" and body["details"]["group"] == "kueue.x-k8s.io"


def test_invalid_kueue_object_is_422_naming_the_field(sandbox_cluster):
    name = f"cq-{_uid()}"
    with api_client(sandbox_cluster) as api:
        co = client.CustomObjectsApi(api)
        with pytest.raises(ApiException) as exc:
            co.create_cluster_custom_object(*KUEUE, "clusterqueues", _cq(name, queueingStrategy=5))
    assert exc.value.status == 422
    body = json.loads(exc.value.body)
    assert body["reason"] == "Invalid"
    assert "spec.queueingStrategy" in body["message"]
    assert any(c.get("field") == "spec.queueingStrategy" for c in body["details"]["causes"])


def test_pagination_with_limit_and_continue(sandbox_cluster, ns):
    with api_client(sandbox_cluster) as api:
        v1 = client.CoreV1Api(api)
        for i in range(23):
            v1.create_namespaced_config_map(ns, {"metadata": {"name": f"cm-{i:02d}"}, "data": {"i": str(i)}})
        seen, token, pages = [], None, 0
        while True:
            page = v1.list_namespaced_config_map(ns, limit=10, _continue=token)
            pages += 1
            seen += [i.metadata.name for i in page.items]
            token = page.metadata._continue
            if not token:
                break
        assert pages == 3
        assert seen == [f"cm-{i:02d}" for i in range(23)]


def test_dynamic_client_server_side_apply(sandbox_cluster, ns, tmp_path):
    with api_client(sandbox_cluster) as api:
        dyn = DynamicClient(api, cache_file=str(tmp_path / "discovery.json"))
        lqs = dyn.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="LocalQueue")
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": "dyn", "namespace": ns}, "spec": {"clusterQueue": "cq-dyn"}}
        out = dyn.server_side_apply(lqs, body=body, field_manager="portal", force_conflicts=True)
        assert out.metadata.name == "dyn" and out.spec.clusterQueue == "cq-dyn"
        body["metadata"]["labels"] = {"rev": "2"}
        out = dyn.server_side_apply(lqs, body=body, field_manager="portal", force_conflicts=True)
        assert out.metadata.labels.rev == "2"
        got = lqs.get(name="dyn", namespace=ns)
        assert got.metadata.labels.rev == "2"
        patched = lqs.patch(body={"metadata": {"name": "dyn", "labels": {"x": "y"}}}, namespace=ns,
                            content_type="application/merge-patch+json")
        assert patched.metadata.labels.x == "y"
        stale = got.to_dict()
        stale["metadata"]["labels"] = {"rev": "stale"}
        with pytest.raises(ConflictError):
            lqs.replace(body=stale, namespace=ns)
        lqs.delete(name="dyn", namespace=ns, body={"propagationPolicy": "Background"})
        with pytest.raises(NotFoundError):
            lqs.get(name="dyn", namespace=ns)


def test_cbor_body_is_415(sandbox_cluster, ns):
    """CBOR is not decoded (protobuf is: tests/sandbox/test_protobuf.py)."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cadata=sandbox_cluster.ca_pem.decode())
    req = urllib.request.Request(f"{sandbox_cluster.url}/api/v1/namespaces/{ns}/configmaps", data=b"\xd9\xd9\xf7\xa0",
                                 method="POST", headers={"Content-Type": "application/cbor",
                                                         "Authorization": f"Bearer {sandbox_cluster.token}"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, context=ctx, timeout=10)
    assert exc.value.code == 415
    assert json.loads(exc.value.read())["reason"] == "UnsupportedMediaType"


def test_plain_http_on_the_same_port(sandbox_cluster, ns):
    """The port also answers plain http (TLS is sniffed); the bearer token is still required."""
    import urllib.request

    req = urllib.request.Request(f"{sandbox_cluster.http_url}/api/v1/namespaces/{ns}",
                                 headers={"Authorization": f"Bearer {sandbox_cluster.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"] == "application/json"
        assert json.loads(resp.read())["kind"] == "Namespace"


def test_table_output_uses_printer_columns(sandbox_cluster):
    name = f"cq-{_uid()}"
    with api_client(sandbox_cluster) as api:
        client.CustomObjectsApi(api).create_cluster_custom_object(*KUEUE, "clusterqueues", _cq(name, cohortName="tbl"))
    status, _, table = control(sandbox_cluster, "GET", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{name}",
                               headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    assert status == 200
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:2] == ["Name", "Cohort"]
    assert table["rows"][0]["cells"][:2] == [name, "tbl"]
    assert table["metadata"]["resourceVersion"]


def test_pod_log_is_text(sandbox_cluster, ns):
    with api_client(sandbox_cluster) as api:
        v1 = client.CoreV1Api(api)
        v1.create_namespaced_pod(ns, {"metadata": {"name": "p", "annotations": {"sandbox.gpuportal.dev/log": "hello\nworld"}},
                                      "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
        log = v1.read_namespaced_pod_log("p", ns)
        assert "hello\nworld" in log
        assert v1.read_namespaced_pod_log("p", ns, tail_lines=1).strip().splitlines()[-1] in ("world", log.strip().splitlines()[-1])


def test_fault_injection_429_retry_after_and_latency(fresh_sandbox):
    sb = fresh_sandbox
    status, _, cfg = control(sb, "PUT", "/sandbox/faults", {"error_rate": 1.0, "error_codes": [429], "retry_after": 1})
    assert status == 200 and cfg["error_rate"] == 1.0 and cfg["error_codes"] == [429]
    with api_client(sb) as api:
        v1 = client.CoreV1Api(api)
        # urllib3 (under the official client) honours Retry-After on 429/503: three retries one second apart
        t0 = time.monotonic()
        with pytest.raises(ApiException) as exc:
            v1.list_namespace()
        assert time.monotonic() - t0 >= 2.9
        assert exc.value.status == 429
        assert exc.value.headers["Retry-After"] == "1"
        assert _reason(exc.value) == "TooManyRequests"
        control(sb, "PUT", "/sandbox/faults", {"error_rate": 1.0, "error_codes": [503, 500], "retry_after": 0})
        for _ in range(5):
            with pytest.raises(ApiException) as exc:
                v1.list_namespace()
            assert exc.value.status in (500, 503)
            assert ("Retry-After" in exc.value.headers) == (exc.value.status == 503)
        control(sb, "PUT", "/sandbox/faults", {"latency_ms": 300})
        t0 = time.monotonic()
        v1.list_namespace()
        assert time.monotonic() - t0 >= 0.3
        control(sb, "PUT", "/sandbox/faults", {})
        t0 = time.monotonic()
        v1.list_namespace()
        assert time.monotonic() - t0 < 0.3
    status, _, body = control(sb, "PUT", "/sandbox/faults", {"error_rate": 2})
    assert status == 400 and body["reason"] == "BadRequest"
    status, _, cfg = control(sb, "GET", "/sandbox/faults")
    assert cfg == {"error_rate": 0.0, "error_codes": [500, 503, 429], "retry_after": 1, "latency_ms": 0,
                   "drop_watches_after_s": None, "drop_watches_mode": "clean"}


def test_advance_and_tick_endpoints(fresh_sandbox):
    sb = fresh_sandbox
    before = sb.clock.now()
    status, _, body = control(sb, "POST", "/sandbox/advance", {"seconds": 3600})
    assert status == 200 and "now" in body
    assert (sb.clock.now() - before).total_seconds() >= 3600
    status, _, body = control(sb, "POST", "/sandbox/tick")
    assert status == 200 and "resourceVersion" in body


def test_restart_keeps_state_and_port(fresh_sandbox):
    sb = fresh_sandbox
    port = sb.port
    with api_client(sb) as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "survivor"}})
    status, _, _ = control(sb, "POST", "/sandbox/restart")
    assert status == 200
    deadline = time.monotonic() + 10
    while True:
        try:
            with api_client(sb) as api:
                ns = client.CoreV1Api(api).read_namespace("survivor")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert ns.metadata.name == "survivor" and sb.port == port
