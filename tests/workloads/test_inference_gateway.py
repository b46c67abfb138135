"""An inference service's route and autoscaler where the cluster serves the Gateway API and KEDA (docs/inference.md):
an HTTPRoute instead of the Ingress, a ScaledObject instead of the HPA; rendered, checked by the portal's forward
auth, and end to end in a sandbox whose profile serves both APIs (applied, read back, scaled, deleted on stop)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from portal.kube import kube_cache_clear, kube_for
from sandbox.profile import load_profile
from sandbox.testing import _start
from tenants.access import Actor
from workloads import endpoints, services
from workloads.kinds import request_manifests
from workloads.models import RequestState

from .factories import make_request
from .test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures used below

S = RequestState
ROUTE = ("gateway.networking.k8s.io/v1", "HTTPRoute")
SCALED = ("keda.sh/v1alpha1", "ScaledObject")
HPA = ("autoscaling/v2", "HorizontalPodAutoscaler")
INGRESS = ("networking.k8s.io/v1", "Ingress")


@pytest.mark.django_db
def test_where_served_the_route_is_an_http_route_and_the_autoscaler_a_scaled_object(cast, cat) -> None:
    svc = make_request(cat, cast.vision, cast.carol, template=cat.inference, replicas=4, state=S.APPROVED,
                       parameters={"model_uri": "hf://m", "min_replicas": 2, "target_requests_per_second": 0.25})
    objects = {o["kind"]: o for o in request_manifests(
        svc, inference_domain="ai.example.org", portal_url="https://gpu.example.org", gateway_api=True,
        gateway="gateway-system/inference", auth_service="gpu-portal/gpu-portal-web:80", keda=True,
        prometheus_url="http://prometheus.monitoring:9090")}
    assert set(objects) == {"Service", "Deployment", "HTTPRoute", "ScaledObject"}  # no Ingress, no HPA
    route = objects["HTTPRoute"]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "inference", "namespace": "gateway-system"}]
    assert route["spec"]["hostnames"] == [f"{svc.k8s_name}-{svc.project.namespace}.ai.example.org"]
    (rule,) = route["spec"]["rules"]
    assert [m["path"] for m in rule["matches"]] == [{"type": "Exact", "value": p} for p in (
        "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings")]
    assert rule["backendRefs"] == [{"name": svc.k8s_name, "port": 80}]
    assert rule["filters"] == [{"type": "ExternalAuth", "externalAuth": {
        "protocol": "HTTP", "backendRef": {"name": "gpu-portal-web", "namespace": "gpu-portal", "port": 80},
        "http": {"path": f"/inference/auth/{svc.pk}"}}}]
    scaled = objects["ScaledObject"]["spec"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": svc.k8s_name}
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (2, 4)
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "0.25"
    assert trigger["metadata"]["serverAddress"] == "http://prometheus.monitoring:9090"
    assert f'namespace="{svc.project.namespace}"' in trigger["metadata"]["query"]
    assert f'pod=~"{svc.k8s_name}-.*"' in trigger["metadata"]["query"]
    assert "replicas" not in objects["Deployment"]["spec"]  # KEDA's HPA owns the size
    # A fixed size has no autoscaler of either kind; without a domain, no route of either kind.
    fixed = make_request(cat, cast.vision, cast.carol, template=cat.inference, replicas=2, state=S.APPROVED)
    assert {o["kind"] for o in request_manifests(fixed, gateway_api=True, keda=True)} == {"Service", "Deployment"}


@pytest.mark.django_db
def test_the_gateway_external_auth_check_reads_the_path_after_its_own(client, cast, cat) -> None:
    svc = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING)
    other = make_request(cat, cast.llm, cast.frank, template=cat.inference, state=S.RUNNING)
    mine = endpoints.key_create(actor=Actor(user=cast.carol), request=svc, name="mine").secret
    theirs = endpoints.key_create(actor=Actor(user=cast.frank), request=other, name="theirs").secret

    def auth(path: str, key: str | None) -> int:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
        return client.get(f"/inference/auth/{svc.pk}/{path}", **headers).status_code

    assert auth("v1/completions", mine) == 200
    assert auth("v1/models", mine) == 200
    assert auth("v1/completions", None) == 401
    assert auth("v1/completions", theirs) == 401
    assert auth("v1/%2e%2e/api/v1/secrets", mine) == 400
    assert auth("v1/../api/v1/secrets", mine) in (400, 404)  # the test client folds dot segments: never 200
    assert auth("v1/%252e%252e/x", mine) == 400
    assert auth("api/v1/secrets", mine) == 404
    # The filter asks with the client's own method: a completion is a POST (with its body).
    posted = client.post(f"/inference/auth/{svc.pk}/v1/completions", {"prompt": "x"}, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {mine}")
    assert posted.status_code == 200
    assert client.post(f"/inference/auth/{svc.pk}/v1/completions", {"prompt": "x"},
                       content_type="application/json").status_code == 401


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture
def served_sandbox(tmp_path: Path):
    profile = load_profile()
    profile["apis"] = ["gateway-api", "keda"]
    sb = _start(tmp_path / "sandbox", profile=profile)
    try:
        yield sb
    finally:
        sb.stop()


@pytest.fixture
def world(served_sandbox, cast, worker, settings) -> World:  # noqa: F811 - the fixture named like the imported helper
    settings.PORTAL_INFERENCE_DOMAIN = "ai.example.org"
    settings.PORTAL_INFERENCE_GATEWAY = "gateway-system/inference"
    return _world(served_sandbox, cast, architecture="B")


@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_a_service_gets_an_http_route_and_scales_through_keda_then_both_go_on_stop(world: World, client, api) -> None:
    kube = kube_for(world.cluster)
    assert kube.serves(*ROUTE) and kube.serves(*SCALED)
    svc = world.submit("bob", "inference", "h100-80gb-offline", gpus=1, duration_hours=4, replicas=3,
                       parameters={"model_uri": "hf://org/tiny-llm", "min_replicas": 1,
                                   "target_requests_per_second": 0.05})
    if svc.state == S.PENDING_APPROVAL:
        svc = world.approve(svc)
    svc = world.wait(svc, lambda r: r.state == S.RUNNING, advance=5)
    store, ns = world.sandbox.store, svc.project.namespace
    route = store.get(*ROUTE, svc.k8s_name, ns)
    assert route["spec"]["hostnames"] == [f"{svc.k8s_name}-{ns}.ai.example.org"]
    assert route["spec"]["rules"][0]["backendRefs"] == [{"name": svc.k8s_name, "port": 80}]
    scaled = store.get(*SCALED, svc.k8s_name, ns)
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 3)
    assert store.list(*INGRESS, ns)["items"] == []
    assert [h["metadata"]["name"] for h in store.list(*HPA, ns)["items"]] == [f"keda-hpa-{svc.k8s_name}"]  # KEDA's

    # Load through the portal's proxy: 12 calls within the simulated minute want 3 replicas at 0.05 per second each.
    secret = api("bob").post(f"/api/v1/requests/{svc.pk}/keys/", {"name": "e2e"}, format="json").json()["key"]
    for _ in range(12):
        answer = client.get(f"/inference/{svc.pk}/v1/models", HTTP_AUTHORIZATION=f"Bearer {secret}")
        assert answer.status_code == 200, answer.content
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and store.get("apps/v1", "Deployment", svc.k8s_name, ns)["spec"].get("replicas") != 3:
        time.sleep(0.2)
    assert store.get("apps/v1", "Deployment", svc.k8s_name, ns)["spec"]["replicas"] == 3

    # Scaled to its minimum, it is a fixed size: the ScaledObject goes (and KEDA's HPA with it), the Deployment
    # holds the size.
    scaled = api("bob").post(f"/api/v1/requests/{svc.pk}/scale/", {"replicas": 1}, format="json")
    assert scaled.status_code == 200, scaled.content
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (store.list(*SCALED, ns)["items"] or store.list(*HPA, ns)["items"]):
        time.sleep(0.2)
    assert store.list(*SCALED, ns)["items"] == [] and store.list(*HPA, ns)["items"] == []
    assert store.get("apps/v1", "Deployment", svc.k8s_name, ns)["spec"]["replicas"] == 1
    assert store.list(*ROUTE, ns)["items"]  # the route stays

    services.request_stop(actor=Actor(user=world.cast.bob), request=svc)
    deadline = time.monotonic() + 30  # the worker deletes the service's objects: the route and the ScaledObject too
    while time.monotonic() < deadline and (store.list(*ROUTE, ns)["items"] or store.list(*SCALED, ns)["items"]
                                           or store.list(*HPA, ns)["items"]):
        time.sleep(0.2)
    assert store.list(*ROUTE, ns)["items"] == [] and store.list(*SCALED, ns)["items"] == []
    assert store.list(*HPA, ns)["items"] == []  # KEDA's HPA went with its ScaledObject


def test_a_cluster_without_those_apis_is_asked_once_and_answers_no(fresh_sandbox) -> None:
    from portal.kube import Kube

    kube_cache_clear()
    kube = Kube(kubeconfig_path=str(fresh_sandbox.kubeconfig))
    assert not kube.serves(*ROUTE) and not kube.serves(*SCALED)
    asked = kube.calls["discovery"]
    assert not kube.serves(*ROUTE) and not kube.serves(*SCALED)
    assert kube.calls["discovery"] == asked  # remembered
    assert kube.serves(*HPA)
