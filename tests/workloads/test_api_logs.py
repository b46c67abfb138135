"""GET /api/v1/requests/{id}/logs/: the pods' last log lines through portal.kube, read-only, scoped like the request."""

from __future__ import annotations

import pytest

from portal.kube import kube_cache_clear
from workloads.manifests import REQUEST_LABEL
from workloads.models import RequestState

from .factories import make_request

API = "/api/v1"
pytestmark = pytest.mark.django_db


def test_lists_the_pods_with_their_last_lines(api, cast, cat, fresh_sandbox) -> None:
    kube_cache_clear()
    cat.cluster.kubeconfig_path = str(fresh_sandbox.kubeconfig)
    cat.cluster.save()
    req = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING)
    namespace = req.project.namespace
    store = fresh_sandbox.store
    if store.try_get("v1", "Namespace", namespace) is None:
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for name in ("b-pod", "a-pod"):
        store.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{req.pk}", "namespace": namespace, "labels": {REQUEST_LABEL: str(req.pk)},
                         "annotations": {"sandbox.gpuportal.dev/log": "\n".join(f"line {i}" for i in range(1, 11))}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        })

    body = api("dave").get(f"{API}/requests/{req.pk}/logs/", {"tail": 3}).json()  # a viewer reads logs
    assert [p["name"] for p in body["pods"]] == [f"a-pod-{req.pk}", f"b-pod-{req.pk}"]
    assert body["pods"][0]["log"] == "line 8\nline 9\nline 10\n"
    whole = api("carol").get(f"{API}/requests/{req.pk}/logs/").json()["pods"][1]["log"]  # default: 200 lines
    assert "line 1\n" in whole and whole.endswith("line 10\n")


def test_scoped_validated_and_never_a_500(api, cast, cat, tmp_path) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=RequestState.RUNNING)
    url = f"{API}/requests/{req.pk}/logs/"
    assert api("frank").get(url).status_code == 404  # another tenant's request
    bad = api("carol").get(url, {"tail": 0})
    assert bad.status_code == 400 and "tail" in bad.json()["fields"]
    assert api("carol").get(url).json() == {"pods": []}  # a cluster without a kubeconfig: nothing to read
    assert api("carol").post(url).status_code == 405

    kube_cache_clear()
    cat.cluster.kubeconfig_path = str(tmp_path / "missing.kubeconfig")
    cat.cluster.save()
    down = api("carol").get(url)
    assert down.status_code == 503
    assert down.json()["error"] == "cluster_unavailable" and "did not answer" in down.json()["detail"]
