"""Opening notebooks through the portal, the ingress's auth check, idle culling by activity, and logs.

The first half needs no cluster: who may open a notebook (``/notebooks/auth/`` and the proxy's refusals).
The second half runs a notebook in a fresh sandbox cluster (materialized by a real Celery worker, as in
test_lifecycle) and goes through the Kubernetes API's service proxy to the sandbox's stand-in notebook page.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from workloads import services
from workloads.manifests import REQUEST_LABEL
from workloads.materialize import notebook_token, notebooks_cull_idle
from workloads.models import RequestState, WorkloadRequest

from .factories import make_request
from .test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures used below

S = RequestState


def auth(client, uri: str, **headers: str):
    return client.get("/notebooks/auth/", HTTP_X_ORIGINAL_URI=uri, **headers)


# ------------------------------------------------------------------------------------------------ who may open
@pytest.mark.django_db
def test_auth_endpoint_answers_by_session_and_original_uri(client, as_user, cast, cat) -> None:
    nb = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING)
    uri = f"/notebooks/{nb.pk}/lab/tree/analysis.ipynb?reset"
    assert auth(client, uri).status_code == 401  # nobody signed in

    carol = as_user("carol")
    ok = auth(carol, uri)
    assert ok.status_code == 200
    assert ok["Authorization"] == f"token {notebook_token(nb)}"  # for the ingress to hand to the notebook
    assert ok["X-Auth-Request-User"] == "carol"
    # Traefik's header works the same; the path must be a notebook's.
    assert carol.get("/notebooks/auth/", HTTP_X_FORWARDED_URI=f"/notebooks/{nb.pk}/").status_code == 200
    assert auth(carol, "/requests/1/").status_code == 403
    assert carol.get("/notebooks/auth/").status_code == 403
    training = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    assert auth(carol, f"/notebooks/{training.pk}/").status_code == 403

    assert auth(as_user("dave"), uri).status_code == 403  # a viewer of the project
    assert auth(as_user("frank"), uri).status_code == 403  # another tenant: nothing else to say
    assert auth(as_user("bob"), uri).status_code == 403  # an approver, while the project does not allow it


@pytest.mark.django_db
def test_approvers_open_notebooks_only_where_the_tenant_admin_allows_it(as_user, api, cast, cat) -> None:
    nb = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING)
    bob = as_user("bob")
    assert auth(bob, f"/notebooks/{nb.pk}/lab").status_code == 403
    assert bob.get(f"/notebooks/{nb.pk}/lab").status_code == 403
    # A project admin cannot grant it to themselves; the tenant admin can.
    refused = api("bob").patch(f"/api/v1/projects/{cast.vision.slug}/", {"notebooks_open_to_approvers": True}, format="json")
    assert refused.status_code == 403, refused.content
    done = api("alice").patch(f"/api/v1/projects/{cast.vision.slug}/", {"notebooks_open_to_approvers": True}, format="json")
    assert done.status_code == 200 and done.json()["notebooks_open_to_approvers"] is True
    assert auth(bob, f"/notebooks/{nb.pk}/lab").status_code == 200
    assert auth(as_user("dave"), f"/notebooks/{nb.pk}/lab").status_code == 403  # viewers never


@pytest.mark.django_db
def test_auth_endpoint_refuses_cross_site_writes(as_user, cast, cat) -> None:
    nb = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING)
    carol = as_user("carol")
    uri = f"/notebooks/{nb.pk}/api/contents/x.ipynb"
    post = {"HTTP_X_ORIGINAL_METHOD": "PUT", "HTTP_X_FORWARDED_HOST": "gpu.example.org", "HTTP_X_FORWARDED_PROTO": "https"}
    assert auth(carol, uri, HTTP_ORIGIN="https://evil.example", **post).status_code == 403
    assert auth(carol, uri, HTTP_ORIGIN="https://gpu.example.org", **post).status_code == 200
    assert auth(carol, uri, HTTP_ORIGIN="http://gpu.example.org", **post).status_code == 403  # scheme too
    assert auth(carol, uri, HTTP_ORIGIN="https://evil.example").status_code == 200  # reads are fine
    # ingress-nginx says where the request went in X-Original-URL.
    nginx = {"HTTP_X_ORIGINAL_METHOD": "POST", "HTTP_X_ORIGINAL_URL": f"https://gpu.example.org{uri}"}
    assert auth(carol, uri, HTTP_ORIGIN="https://gpu.example.org", **nginx).status_code == 200
    assert auth(carol, uri, HTTP_ORIGIN="https://evil.example", **nginx).status_code == 403


@pytest.mark.django_db
def test_auth_checks_record_activity_at_most_once_a_minute(as_user, cast, cat) -> None:
    nb = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING)
    carol = as_user("carol")
    assert auth(carol, f"/notebooks/{nb.pk}/lab").status_code == 200
    nb.refresh_from_db()
    first = nb.last_active_at
    assert first is not None and timezone.now() - first < timedelta(seconds=30)
    for _ in range(5):
        auth(carol, f"/notebooks/{nb.pk}/api/status")
    nb.refresh_from_db()
    assert nb.last_active_at == first  # throttled
    assert services.notebook_activity_record(request_id=nb.pk) is False
    # Once the minute is over (cache entry gone, stored time older than a minute), the next request writes.
    from django.core.cache import cache

    cache.clear()
    WorkloadRequest.objects.filter(pk=nb.pk).update(last_active_at=first - timedelta(minutes=5))
    assert services.notebook_activity_record(request_id=nb.pk) is True
    nb.refresh_from_db()
    assert nb.last_active_at > first - timedelta(minutes=5)
    # Someone who may not open it leaves no trace.
    WorkloadRequest.objects.filter(pk=nb.pk).update(last_active_at=None)
    cache.clear()
    auth(as_user("dave"), f"/notebooks/{nb.pk}/lab")
    nb.refresh_from_db()
    assert nb.last_active_at is None


@pytest.mark.django_db
def test_proxy_refusals_without_touching_a_cluster(client, as_user, cast, cat) -> None:
    nb = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.STOPPED,
                      state_reason="Stopped by carol.")
    response = client.get(f"/notebooks/{nb.pk}/lab")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=/notebooks/")
    assert client.post(f"/notebooks/{nb.pk}/api/kernels").status_code == 401
    assert as_user("frank").get(f"/notebooks/{nb.pk}/lab").status_code == 404  # another tenant
    assert as_user("dave").get(f"/notebooks/{nb.pk}/lab").status_code == 403
    stopped = as_user("carol").get(f"/notebooks/{nb.pk}/lab")
    assert stopped.status_code == 503
    body = stopped.content.decode()
    assert "This notebook is stopped" in body and "restart it" in body
    training = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    assert as_user("carol").get(f"/notebooks/{training.pk}/").status_code == 404
    queued = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.QUEUED)
    assert "not running yet" in as_user("carol").get(f"/notebooks/{queued.pk}/lab").content.decode()


# ------------------------------------------------------------------------------------------------ with a cluster
@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:  # noqa: F811 - the fixture named like the imported helper
    return _world(fresh_sandbox, cast, architecture="B")


def _running_notebook(world: World, who: str = "carol") -> WorkloadRequest:
    req = world.submit(who, "notebook", "h100-80gb-offline", gpus=1, duration_hours=4)
    return world.wait(req, lambda r: r.state == S.RUNNING, advance=5)


def _signed_in(client, user):
    client.force_login(user)
    return client


@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_proxy_reaches_the_running_notebook_with_its_token(world: World, client, django_user_model) -> None:
    req = _running_notebook(world)
    carol = _signed_in(client, world.cast.carol)
    page = carol.get(f"/notebooks/{req.pk}/lab?reset")
    assert page.status_code == 200, page.content[:500]
    body = page.content.decode()
    assert f"Notebook of req-{req.pk}" in body
    assert f"/notebooks/{req.pk}/lab" in body  # JupyterLab's base_url is the portal's path: nothing rewritten
    # The fake kernel echoes, for a same-origin POST; a cross-site one never reaches it.
    echo = carol.post(f"/notebooks/{req.pk}/api/kernels/echo", data=b"print(1)", content_type="text/plain",
                      HTTP_ORIGIN="http://testserver")
    assert echo.status_code == 200 and echo.json()["output"] == "print(1)"
    assert carol.post(f"/notebooks/{req.pk}/api/kernels/echo", data=b"x", content_type="text/plain",
                      HTTP_ORIGIN="https://evil.example").status_code == 403
    # Without the portal's token the sandbox notebook refuses, as Jupyter would.
    from portal.kube import kube_for, service_proxy

    bare = service_proxy(kube_for(world.cluster), req.project.namespace, req.k8s_name, "http", f"notebooks/{req.pk}/lab")
    assert bare.status == 403
    req.refresh_from_db()
    assert req.last_active_at is not None

    # No ready pod behind the Service (scaled away by hand): a clear 503 from the portal, not the API's JSON.
    world.sandbox.store.patch("apps/v1", "StatefulSet", req.k8s_name, req.project.namespace,
                              {"spec": {"replicas": 0}}, "merge")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pods = world.sandbox.store.list("v1", "Pod", req.project.namespace, label_selector=f"{REQUEST_LABEL}={req.pk}")
        if not pods["items"]:
            break
        world.sandbox.advance(1)
    gone = carol.get(f"/notebooks/{req.pk}/lab")
    assert gone.status_code == 503
    assert "not reachable right now" in gone.content.decode() and "no endpoints available" in gone.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_idle_culling_counts_activity_on_the_notebook_path(world: World, client) -> None:
    opened = _running_notebook(world)
    timeout = timedelta(minutes=opened.template.idle_timeout_minutes)
    # Started long ago, but used through the portal just now: it stays.
    WorkloadRequest.objects.filter(pk=opened.pk).update(started_at=timezone.now() - 3 * timeout)
    carol = _signed_in(client, world.cast.carol)
    assert carol.get(f"/notebooks/{opened.pk}/lab").status_code == 200
    assert notebooks_cull_idle(timezone.now() + timeout - timedelta(minutes=1)) == 0
    opened.refresh_from_db()
    assert opened.state == S.RUNNING
    # Idle for longer than the limit since that request: stopped.
    assert notebooks_cull_idle(timezone.now() + timeout + timedelta(minutes=1)) == 1
    opened.refresh_from_db()
    assert opened.state == S.STOPPED and "without activity" in opened.state_reason


@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_idle_culling_falls_back_to_the_start_and_ignores_activity_before_a_restart(world: World) -> None:
    never = _running_notebook(world)
    timeout = timedelta(minutes=never.template.idle_timeout_minutes)
    # Never opened: the start time counts.
    assert notebooks_cull_idle(never.started_at + timeout - timedelta(minutes=1)) == 0
    # Opened long ago, before it was restarted a minute ago: the restart is the last sign of life.
    WorkloadRequest.objects.filter(pk=never.pk).update(last_active_at=timezone.now() - 5 * timeout,
                                                        started_at=timezone.now() - timedelta(minutes=1))
    assert notebooks_cull_idle(timezone.now()) == 0
    never.refresh_from_db()
    assert never.state == S.RUNNING
    assert notebooks_cull_idle(timezone.now() + timeout) == 1


# ------------------------------------------------------------------------------------------------ logs
@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_logs_tail_follow_and_download(world: World, client) -> None:
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    world.sandbox.advance(65)  # a few progress lines
    carol = _signed_in(client, world.cast.carol)
    pod = world.sandbox.store.list("v1", "Pod", req.project.namespace, label_selector=f"{REQUEST_LABEL}={req.pk}")["items"][0]
    name = pod["metadata"]["name"]

    # Download: the whole log, as a plain-text attachment, each line with its cluster timestamp.
    download = carol.get(f"/requests/{req.pk}/logs/download/?pod={name}")
    assert download.status_code == 200
    assert download["Content-Type"].startswith("text/plain")
    assert download["Content-Disposition"] == f'attachment; filename="req-{req.pk}-{name}.log"'
    lines = download.content.decode().splitlines()
    assert len(lines) >= 6 and all(line[:4].isdigit() and "T" in line.split(" ")[0] for line in lines)
    assert any("devices: nvidia.com/gpu=1" in line for line in lines)
    assert any(" step 200: loss=" in line for line in lines)

    # The page: the last N lines, each stamped with cluster time (and the page says which clock that is).
    page = carol.get(f"/requests/{req.pk}/logs/?tail=2").content.decode()
    assert "cluster time" in page and "portal time" in page
    assert page.count('data-clock="cluster"') == 2
    assert lines[-1].split(" ", 1)[1] in page and lines[-3].split(" ", 1)[1] not in page
    assert carol.get(f"/requests/{req.pk}/logs/download/?pod=nope").status_code == 404
    everything = carol.get(f"/requests/{req.pk}/logs/download/").content.decode()
    assert everything.startswith(f"==> {name} <==")
    assert _signed_in(type(client)(), world.cast.frank).get(f"/requests/{req.pk}/logs/download/").status_code == 404

    # Follow: only the lines after the cursor, even when several share the cursor's second.
    last = lines[-1].split(" ")[0]
    same = sum(1 for line in lines if line.split(" ")[0] == last)
    follow = carol.get(f"/requests/{req.pk}/logs/follow/", {"pods": name, "c": f"{name}|{last}|{same}"},
                       HTTP_HX_REQUEST="true")
    assert follow.status_code == 200
    assert "log-line" not in follow.content.decode()  # nothing new yet
    world.sandbox.advance(60)
    now = carol.get(f"/requests/{req.pk}/logs/download/?pod={name}").content.decode().splitlines()
    expected = now[len(lines):]
    assert len(expected) >= 2  # two more progress lines at least
    follow = carol.get(f"/requests/{req.pk}/logs/follow/", {"pods": name, "c": f"{name}|{last}|{same}"},
                       HTTP_HX_REQUEST="true").content.decode()
    assert follow.count('class="log-line"') == len(expected)
    assert all(line.split(" ", 1)[1] in follow for line in expected)
    assert f'hx-swap-oob="beforeend:#log-{name}"' in follow and 'id="log-follow"' in follow
    # A pod the page does not show (or one gone): the whole section comes again.
    other = carol.get(f"/requests/{req.pk}/logs/follow/", {"pods": "someone-else", "c": "someone-else|"},
                      HTTP_HX_REQUEST="true")
    assert other["HX-Retarget"] == "#request-logs" and f'id="log-{name}"' in other.content.decode()


def test_sandbox_log_options(sandbox_cluster) -> None:
    """The sandbox's ``log`` subresource takes tailLines, sinceTime, timestamps and limitBytes as kubelet does."""
    store = sandbox_cluster.store
    ns = "logs-options"
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    store.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    sandbox_cluster.logs[(ns, "p")] = ["2026-01-01 10:00:00 one", "2026-01-01 10:00:00 two", "2026-01-01 10:00:05 three"]
    from portal.kube import Kube, pod_log_read

    kube = Kube(kubeconfig_path=str(sandbox_cluster.kubeconfig))
    try:
        assert pod_log_read(kube, ns, "p") == "one\ntwo\nthree\n"  # runtime timestamps only when asked for
        assert pod_log_read(kube, ns, "p", tail_lines=1, timestamps=True) == "2026-01-01T10:00:05.000000000Z three\n"
        assert pod_log_read(kube, ns, "p", since_time="2026-01-01T10:00:01Z") == "three\n"
        assert pod_log_read(kube, ns, "p", since_time="2026-01-01T10:00:00Z", timestamps=True).count("\n") == 3
        assert pod_log_read(kube, ns, "p", limit_bytes=5) == "one\nt"
        assert pod_log_read(kube, ns, "gone") is None
    finally:
        kube.close()
