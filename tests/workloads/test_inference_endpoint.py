"""Inference services that serve: their address, API keys, the portal's proxy and autoscaling (docs/inference.md).

The first half needs no cluster: the rendered objects, the keys (page and API, who may, audited, stored hashed), and
every refusal of the proxy and of the route's forward-auth check. The second half runs a service in a fresh sandbox
cluster, calls it end to end through the portal's proxy with and without a key, and loads it until it scales up.
"""

from __future__ import annotations

import hashlib
import time

import pytest

from tenants.access import Actor
from tenants.models import AuditEntry
from workloads import endpoints, services
from workloads.kinds import request_manifests
from workloads.models import InferenceKey, ReplicaSample, RequestState

from .factories import make_request
from .test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures used below

S = RequestState


def _by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


# ------------------------------------------------------------------------------------------------ rendering
@pytest.mark.django_db
def test_rendered_objects_roll_safely_scale_between_bounds_and_route_under_the_domain(cast, cat) -> None:
    fixed = make_request(cat, cast.vision, cast.carol, template=cat.inference, replicas=2, state=S.APPROVED)
    objects = _by_kind(request_manifests(fixed))
    assert set(objects) == {"Service", "Deployment"}  # no domain, no autoscaling asked: as before
    assert objects["Deployment"]["spec"]["replicas"] == 2
    assert objects["Deployment"]["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}

    scaled = make_request(cat, cast.vision, cast.carol, template=cat.inference, replicas=4, state=S.APPROVED,
                          parameters={"model_uri": "hf://m", "min_replicas": 1, "target_requests_per_second": 0.25})
    objects = _by_kind(request_manifests(scaled, inference_domain="ai.example.org", portal_url="https://gpu.example.org"))
    assert "replicas" not in objects["Deployment"]["spec"]  # the autoscaler owns the size
    hpa = objects["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)  # the approval's 4 is the ceiling
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "http_requests_per_second"}, "target": {"type": "AverageValue", "averageValue": "250m"}}}]
    ingress = objects["Ingress"]
    host = f"{scaled.k8s_name}-{scaled.project.namespace}.ai.example.org"
    assert ingress["spec"]["rules"][0]["host"] == host
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-url"] == \
        f"https://gpu.example.org/inference/auth/{scaled.pk}/"
    assert [p["path"] for p in ingress["spec"]["rules"][0]["http"]["paths"]] == [
        "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings"]
    assert all(p["pathType"] == "Exact" for p in ingress["spec"]["rules"][0]["http"]["paths"])

    # A row from before submissions refused it (test_inference_bounds.py): a minimum above the approval is held to it.
    over = make_request(cat, cast.vision, cast.carol, template=cat.inference, replicas=2, state=S.APPROVED,
                        parameters={"model_uri": "hf://m", "min_replicas": 5})
    assert "HorizontalPodAutoscaler" not in _by_kind(request_manifests(over))


# ------------------------------------------------------------------------------------------------ keys
@pytest.mark.django_db
def test_keys_are_made_by_requester_or_approvers_shown_once_stored_hashed_and_audited(api, cast, cat) -> None:
    svc = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING)
    made = api("carol").post(f"/api/v1/requests/{svc.pk}/keys/", {"name": "chat frontend"}, format="json")
    assert made.status_code == 201, made.content
    secret = made.json()["key"]
    assert secret.startswith("gpk-") and len(secret) > 40
    row = InferenceKey.objects.get(pk=made.json()["id"])
    assert row.digest == hashlib.sha256(secret.encode()).hexdigest() and secret not in (row.prefix, row.digest)
    listed = api("bob").get(f"/api/v1/requests/{svc.pk}/keys/")  # a project admin
    assert listed.status_code == 200 and [k["name"] for k in listed.json()] == ["chat frontend"]
    assert "key" not in listed.json()[0] and secret not in listed.content.decode()

    assert api("dave").get(f"/api/v1/requests/{svc.pk}/keys/").status_code == 403  # a viewer
    assert api("dave").post(f"/api/v1/requests/{svc.pk}/keys/", {"name": "x"}, format="json").status_code == 403
    assert api("frank").post(f"/api/v1/requests/{svc.pk}/keys/", {"name": "x"}, format="json").status_code == 404
    blank = api("carol").post(f"/api/v1/requests/{svc.pk}/keys/", {"name": "  "}, format="json")
    assert blank.status_code == 400 and "name" in blank.content.decode()
    training = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    assert api("carol").post(f"/api/v1/requests/{training.pk}/keys/", {"name": "x"}, format="json").status_code == 400

    revoked = api("bob").delete(f"/api/v1/requests/{svc.pk}/keys/{row.pk}/")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert api("bob").delete(f"/api/v1/requests/{svc.pk}/keys/999999/").status_code == 404
    actions = list(AuditEntry.objects.filter(action__startswith="inference_key.").values_list("action", flat=True))
    assert sorted(actions) == ["inference_key.create", "inference_key.revoke"]


@pytest.mark.django_db
def test_the_endpoint_page_makes_and_revokes_keys(as_user, cast, cat) -> None:
    svc = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING)
    carol = as_user("carol")
    assert f"/requests/{svc.pk}/endpoint/" in carol.get(f"/requests/{svc.pk}/").content.decode()  # linked
    page = carol.get(f"/requests/{svc.pk}/endpoint/")
    assert page.status_code == 200 and "No key yet" in page.content.decode()
    assert f"/inference/{svc.pk}/" in page.content.decode()
    made = carol.post(f"/requests/{svc.pk}/endpoint/keys/", {"name": "batch eval"})
    assert made.status_code == 302 and made["Location"] == f"/requests/{svc.pk}/endpoint/"  # a reload re-sends nothing
    shown = carol.get(made["Location"])
    body = shown.content.decode()
    assert "Copy it now" in body and shown["Cache-Control"] == "no-store"
    key = InferenceKey.objects.get(request=svc)
    secret = body.split('<code>gpk-', 1)[1].split("</code>", 1)[0]
    assert hashlib.sha256(f"gpk-{secret}".encode()).hexdigest() == key.digest
    again = carol.get(f"/requests/{svc.pk}/endpoint/").content.decode()
    assert secret not in again and key.prefix in again  # shown once
    assert carol.post(f"/requests/{svc.pk}/endpoint/keys/", {"name": ""}).status_code == 400
    done = carol.post(f"/requests/{svc.pk}/endpoint/keys/{key.pk}/revoke/")
    assert done.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert as_user("dave").get(f"/requests/{svc.pk}/endpoint/").status_code == 403  # a viewer
    assert as_user("frank").get(f"/requests/{svc.pk}/endpoint/").status_code == 404  # another tenant


# ------------------------------------------------------------------------------------------------ the proxy's refusals
@pytest.mark.django_db
def test_proxy_refuses_without_a_valid_key_of_that_service(client, cast, cat, settings) -> None:
    svc = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.QUEUED)
    other = make_request(cat, cast.llm, cast.frank, template=cat.inference, state=S.QUEUED)  # another tenant's
    mine = endpoints.key_create(actor=Actor(user=cast.carol), request=svc, name="mine").secret
    theirs = endpoints.key_create(actor=Actor(user=cast.frank), request=other, name="theirs").secret
    gone = endpoints.key_create(actor=Actor(user=cast.carol), request=svc, name="gone")
    endpoints.key_revoke(actor=Actor(user=cast.bob), request=svc, key_id=gone.key.pk)
    url = f"/inference/{svc.pk}/v1/models"

    def call(path: str = url, key: str | None = None, **extra):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key is not None else {}
        return client.get(path, **headers, **extra)

    assert call().status_code == 401
    assert call().json()["error"]["type"] == "invalid_api_key"
    assert call(key="gpk-not-a-key").status_code == 401
    assert call(key=gone.secret).status_code == 401  # revoked
    assert call(key=theirs).status_code == 401  # another tenant's service's key
    assert client.get(url, HTTP_AUTHORIZATION=f"Token {mine}").status_code == 401  # Bearer only
    assert call(f"/inference/{other.pk}/v1/models", key=mine).status_code == 401  # and the other way round
    assert call("/inference/999999/v1/models", key=mine).status_code == 401  # says nothing of what exists
    # The session of a signed-in member is no key.
    client.force_login(cast.carol)
    assert call().status_code == 401
    client.logout()

    # Paths: refused exactly as portal.urlpaths refuses them, before anything else; only the model paths go on.
    for attack in (f"/inference/{svc.pk}/v1/../../api/v1/secrets", f"/inference/{svc.pk}/v1/%2e%2e/%2e%2e/api/v1/secrets",
                   f"/inference/{svc.pk}/v1/models/..", f"/inference/{svc.pk}/v1/%252e%252e/api",
                   f"/inference/{svc.pk}/v1\\..\\api", f"/inference/{svc.pk}/./v1/models"):
        answer = call(attack, key=mine)
        assert answer.status_code == 400, (attack, answer.status_code)
        assert "refused" in answer.json()["error"]["message"]
    for elsewhere in ("api/v1/namespaces", "v1/models/x", "metrics", "v1/fine_tuning/jobs", "health"):
        assert call(f"/inference/{svc.pk}/{elsewhere}", key=mine).status_code == 404, elsewhere
    assert client.post(url, HTTP_AUTHORIZATION=f"Bearer {mine}").status_code == 405

    # A live key of the service gets past the checks: this one is not running yet.
    assert call(key=mine).status_code == 503
    # And it is rate limited, per key.
    settings.INFERENCE_RATE_KEY = "2/min"
    codes = [call(key=mine).status_code for _ in range(3)]
    assert codes[-1] == 429 and call(key=mine)["Retry-After"]
    assert call(f"/inference/{other.pk}/v1/models", key=theirs).status_code == 503  # another key: its own count


@pytest.mark.django_db
def test_forward_auth_checks_key_and_original_path(client, cast, cat) -> None:
    svc = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING)
    other = make_request(cat, cast.llm, cast.frank, template=cat.inference, state=S.RUNNING)
    mine = endpoints.key_create(actor=Actor(user=cast.carol), request=svc, name="mine").secret
    theirs = endpoints.key_create(actor=Actor(user=cast.frank), request=other, name="theirs").secret

    def auth(uri: str, key: str | None) -> int:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
        return client.get(f"/inference/auth/{svc.pk}/", HTTP_X_ORIGINAL_URI=uri, **headers).status_code

    assert auth("/v1/completions", mine) == 200
    assert auth("/v1/chat/completions?stream=true", mine) == 200
    assert auth("/v1/completions", None) == 401
    assert auth("/v1/completions", theirs) == 401
    assert auth("/v1/%2e%2e/api/v1/secrets", mine) == 400
    assert auth("/v1/%2fapi", mine) == 400
    assert auth("/v1/%252e%252e/x", mine) == 400
    assert auth("/api/v1/secrets", mine) == 404


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:  # noqa: F811 - the fixture named like the imported helper
    return _world(fresh_sandbox, cast, architecture="B")


@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_a_client_calls_the_service_through_the_proxy_with_a_key_and_it_scales_up_under_load(
        world: World, client, api) -> None:
    svc = world.submit("bob", "inference", "h100-80gb-offline", gpus=1, duration_hours=4, replicas=3,
                       parameters={"model_uri": "hf://org/tiny-llm", "min_replicas": 1,
                                   "target_requests_per_second": 0.05})
    if svc.state == S.PENDING_APPROVAL:
        svc = world.approve(svc)
    svc = world.wait(svc, lambda r: r.state == S.RUNNING, advance=5)
    hpa = world.sandbox.store.get("autoscaling/v2", "HorizontalPodAutoscaler", svc.k8s_name, svc.project.namespace)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
    assert svc.state_reason == "1 of 1 replica ready."

    secret = api("bob").post(f"/api/v1/requests/{svc.pk}/keys/", {"name": "e2e"}, format="json").json()["key"]
    base = f"/inference/{svc.pk}/v1"
    assert client.get(f"{base}/models").status_code == 401  # without a key
    models = client.get(f"{base}/models", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert models.status_code == 200, models.content
    assert [m["id"] for m in models.json()["data"]] == ["org/tiny-llm"]
    body = {"model": "org/tiny-llm", "prompt": "Say hello", "max_tokens": 5}
    first = client.post(f"{base}/completions", body, content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert first.status_code == 200, first.content
    text = first.json()["choices"][0]["text"]
    assert len(text.split()) == 5 and first.json()["usage"]["completion_tokens"] == 5
    again = client.post(f"{base}/completions", body, content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert again.json()["choices"][0]["text"] == text  # deterministic
    assert client.post(f"{base}/completions", body, content_type="application/json").status_code == 401

    # Load: 0.05 requests per second per replica is 3 a minute; 12 more within the minute want 3 replicas (the max).
    for _ in range(12):
        assert client.get(f"{base}/models", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        deploy = world.sandbox.store.get("apps/v1", "Deployment", svc.k8s_name, svc.project.namespace)
        if deploy["spec"].get("replicas") == 3:
            break
        time.sleep(0.2)
    assert deploy["spec"]["replicas"] == 3
    svc = world.wait(svc, lambda r: r.state_reason == "3 of 3 replicas ready.", advance=1)
    sizes = list(ReplicaSample.objects.filter(request=svc).values_list("replicas", flat=True))
    assert sizes[0] == 1 and sizes[-1] == 3
    page = client.get(f"/requests/{svc.pk}/endpoint/")
    assert page.status_code == 302  # signed out: to the sign-in page
    client.force_login(world.cast.bob)
    page = client.get(f"/requests/{svc.pk}/endpoint/").content.decode()
    assert 'data-chart="replica-chart"' in page and "Replicas over time" in page
    services.request_stop(actor=Actor(user=world.cast.bob), request=svc)
    assert client.get(f"{base}/models", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 503
    deadline = time.monotonic() + 30  # the worker deletes the service's objects, its autoscaler among them
    while time.monotonic() < deadline and world.sandbox.store.list(
            "autoscaling/v2", "HorizontalPodAutoscaler", svc.project.namespace)["items"]:
        time.sleep(0.2)
    assert world.sandbox.store.list("autoscaling/v2", "HorizontalPodAutoscaler", svc.project.namespace)["items"] == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_a_bigger_batch_job_does_not_preempt_a_running_service(world: World) -> None:
    svc = world.submit("bob", "inference", "h100-80gb-offline", gpus=1, duration_hours=4, replicas=1)
    if svc.state == S.PENDING_APPROVAL:
        svc = world.approve(svc)
    svc = world.wait(svc, lambda r: r.state == S.RUNNING, advance=5)
    assert svc.priority == "production"
    job = world.submit("bob", "training", "h100-80gb-offline", gpus=8, duration_hours=1, priority="batch")
    if job.state == S.PENDING_APPROVAL:
        job = world.approve(job)
    job = world.wait(job, lambda r: r.state == S.QUEUED and bool(r.pending_reason), advance=5)
    for _ in range(5):
        world.sandbox.advance(10)
        world.sync()
    svc.refresh_from_db()
    job.refresh_from_db()
    assert svc.state == S.RUNNING and job.state == S.QUEUED
    assert not svc.events.filter(to_state=S.PREEMPTED).exists()
    services.request_stop(actor=Actor(user=world.cast.bob), request=svc)
    job = world.wait(job, lambda r: r.state == S.RUNNING, advance=5)
