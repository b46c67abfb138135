"""The notebook proxy and the ingress's auth check never let a path walk out of the notebook's own place.

A signed-in user with a running notebook once reached any Kubernetes API path with the portal's credentials
(``/notebooks/2/../../../../api/v1/secrets``): the proxy appended the path to the Service's proxy prefix, and the
HTTP client removed the dot segments before sending. Every spelling of such a walk below is refused by the proxy
(400), by the auth endpoint (403, also for WebSocket upgrades) and by ``portal.kube.service_proxy`` itself; the last
test runs a real notebook in a sandbox cluster and reads the sandbox's log of requests to show that none of them
left the notebook's service-proxy prefix.
"""

from __future__ import annotations

import pytest

from portal.urlpaths import PathRefused, rebuilt, refusal, under_prefix
from workloads.models import RequestState, WorkloadRequest

from .factories import make_request
from .test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures used below

S = RequestState

# What follows /notebooks/<id>/ in the request a browser (or curl --path-as-is) sends.
TRAVERSALS = [
    "../../../../../../../../../api/v1/secrets",  # raw
    "lab/../../../../../../../../../../api/v1/nodes",
    "%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/api/v1/secrets",  # percent-encoded
    "%2E%2e/%2e%2E/%2E%2E/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/api/v1/secrets",  # mixed case
    ".%2e/.%2e/.%2e/.%2e/.%2e/.%2e/.%2e/.%2e/api/v1/secrets",  # half-encoded
    "%252e%252e/%252e%252e/%252e%252e/%252e%252e/%252e%252e/%252e%252e/api/v1/secrets",  # double-encoded
    "%25252e%25252e/%25252e%25252e/api/v1/secrets",  # three times
    "..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2fapi/v1/secrets",  # encoded slash
    "..%2F..%2F..%2F..%2F..%2F..%2F..%2F..%2Fapi/v1/secrets",
    "..%252f..%252f..%252f..%252fapi/v1/secrets",  # double-encoded slash
    "..\\..\\..\\..\\..\\..\\..\\..\\api\\v1\\secrets",  # backslash
    "..%5c..%5c..%5c..%5c..%5c..%5capi/v1/secrets",  # encoded backslash
    "..;/..;/..;/..;/..;/..;/..;/..;/api/v1/secrets",  # ; parameters
    "..;x=1/..;x=1/..;x=1/..;x=1/..;x=1/..;x=1/api/v1/secrets",
    "lab/./../../../../../../../../api/v1/secrets",
    "./lab",
    "%c0%ae%c0%ae/%c0%ae%c0%ae/api/v1/secrets",  # overlong UTF-8 dots
    "lab%00/../../api/v1/secrets",
]
HARMLESS = ["lab", "lab/tree/analysis.ipynb", "api/contents/My%20Notebook.v2.ipynb", "files/...hidden", "lab/tree/a..b"]


# ------------------------------------------------------------------------------------------------ the pure rules
def unquote(path: str) -> str:
    """What a WSGI server and Django make of a path: decoded once, bytes that are not UTF-8 left percent-encoded."""
    from urllib.parse import unquote_to_bytes

    from django.utils.encoding import repercent_broken_unicode

    return repercent_broken_unicode(unquote_to_bytes(path)).decode()


@pytest.mark.parametrize("tail", TRAVERSALS)
def test_every_traversal_spelling_is_refused_as_sent_and_as_decoded(tail: str) -> None:
    assert refusal(f"/notebooks/2/{tail}", decoded=False), tail  # X-Original-URI, RAW_URI: as sent
    assert refusal(unquote(tail), decoded=True), tail  # PATH_INFO: decoded once by the server
    with pytest.raises(PathRefused):
        rebuilt(unquote(tail))


@pytest.mark.parametrize("tail", HARMLESS)
def test_ordinary_notebook_paths_pass(tail: str) -> None:
    assert refusal(f"/notebooks/2/{tail}", decoded=False) is None
    assert refusal(unquote(tail), decoded=True) is None


def test_a_built_url_is_checked_as_the_http_client_parses_it() -> None:
    prefix = "/api/v1/namespaces/acme-vision/services/req-2:http/proxy/"
    assert under_prefix(prefix + rebuilt("notebooks/2/lab/tree/a b;c.ipynb"), prefix)
    assert rebuilt("a b;c/d?e#f") == "a%20b%3Bc/d%3Fe%23f"  # nothing in a segment reads as a separator
    assert not under_prefix(prefix + "../../../secrets", prefix)  # urllib3 would send /api/v1/namespaces/secrets
    assert not under_prefix(prefix + "x/%2e%2e/%2E%2E/y", prefix)
    assert not under_prefix(prefix + "x%2Fy", prefix)
    assert not under_prefix("/api/v1/namespaces/acme-vision/services/req-3:http/proxy/lab", prefix)


# ------------------------------------------------------------------------------------------------ the auth endpoint
def _auth(client, uri: str, **headers: str):
    return client.get("/notebooks/auth/", HTTP_X_ORIGINAL_URI=uri, **headers)


@pytest.mark.django_db
def test_auth_endpoint_refuses_dot_segments_even_into_another_own_notebook(as_user, cast, cat) -> None:
    mine = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING)
    bobs = make_request(cat, cast.vision, cast.bob, template=cat.notebook, state=S.RUNNING)
    carol = as_user("carol")
    assert _auth(carol, f"/notebooks/{mine.pk}/lab").status_code == 200
    for uri in [f"/notebooks/{mine.pk}/../{bobs.pk}/lab", f"/notebooks/{mine.pk}/%2e%2e/{bobs.pk}/lab",
                f"/notebooks/{mine.pk}/..%2f{bobs.pk}/lab", f"/notebooks/{mine.pk}/..;/{bobs.pk}/lab?x=1",
                f"/notebooks/{mine.pk}/..\\{bobs.pk}/lab"]:
        denied = _auth(carol, uri)
        assert denied.status_code == 403, uri
        assert "Authorization" not in denied and "refused" in denied.content.decode()
    # Traefik's header is held to the same rule.
    assert carol.get("/notebooks/auth/", HTTP_X_FORWARDED_URI=f"/notebooks/{mine.pk}/../{bobs.pk}/").status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize("tail", TRAVERSALS)
def test_auth_endpoint_refuses_every_spelling_for_http_and_websocket(as_user, cast, cat, tail: str) -> None:
    nb = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING)
    carol = as_user("carol")
    plain = _auth(carol, f"/notebooks/{nb.pk}/{tail}")
    assert plain.status_code == 403 and "Authorization" not in plain
    # A kernel's WebSocket: the ingress asks the same endpoint before upgrading.
    ws = _auth(carol, f"/notebooks/{nb.pk}/api/kernels/k1/channels/{tail}", HTTP_UPGRADE="websocket",
               HTTP_CONNECTION="Upgrade", HTTP_X_ORIGINAL_METHOD="GET")
    assert ws.status_code == 403 and "Authorization" not in ws
    ok = _auth(carol, f"/notebooks/{nb.pk}/api/kernels/k1/channels?session_id=s", HTTP_UPGRADE="websocket",
               HTTP_CONNECTION="Upgrade")
    assert ok.status_code == 200


# ------------------------------------------------------------------------------------------------ the proxy, no cluster
@pytest.mark.django_db
@pytest.mark.parametrize("tail", TRAVERSALS)
def test_proxy_refuses_every_spelling_before_any_cluster_is_asked(as_user, cast, cat, tail: str) -> None:
    # A running notebook on no reachable cluster: a path that got past the check would answer 502, not 400.
    nb = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING)
    carol = as_user("carol")
    for method in ("get", "delete", "put"):
        response = getattr(carol, method)(f"/notebooks/{nb.pk}/{tail}", HTTP_ORIGIN="http://testserver")
        if "%00" in tail:  # Django's URL resolver refuses a NUL itself
            assert response.status_code == 404, (method, tail, response.status_code)
            continue
        assert response.status_code == 400, (method, tail, response.status_code)
        assert "refused" in response.content.decode()
    # gunicorn keeps the path as sent in RAW_URI: an encoded slash there is refused even where decoding hid it.
    sent = carol.get(f"/notebooks/{nb.pk}/lab/x", RAW_URI=f"/notebooks/{nb.pk}/lab%2F..%2F..%2Fx")
    assert sent.status_code == 400


# ------------------------------------------------------------------------------------------------ with a cluster
@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:  # noqa: F811 - the fixture named like the imported helper
    return _world(fresh_sandbox, cast, architecture="B")


@pytest.mark.django_db(transaction=True)
@pytest.mark.xdist_group("lifecycle")
@pytest.mark.timeout(240)
def test_no_request_leaves_the_notebooks_prefix_on_a_real_sandbox(world: World, client) -> None:
    from portal.kube import kube_for, service_proxy

    req: WorkloadRequest = world.submit("carol", "notebook", "h100-80gb-offline", gpus=1, duration_hours=4)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    world.sandbox.store.create({"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": "not-the-portals", "namespace": "default"}, "data": {"k": "v"}})
    client.force_login(world.cast.carol)
    assert client.get(f"/notebooks/{req.pk}/lab").status_code == 200  # the notebook itself works

    seen = world.sandbox.server.seen
    seen.clear()
    for tail in TRAVERSALS:
        for method in ("get", "delete"):
            answer = getattr(client, method)(f"/notebooks/{req.pk}/{tail}", HTTP_ORIGIN="http://testserver")
            assert answer.status_code in ((404,) if "%00" in tail else (400,)), (method, tail)
    deleting = "../../../../../../../../../api/v1/namespaces/default/configmaps/not-the-portals"
    assert client.delete(f"/notebooks/{req.pk}/{deleting}", HTTP_ORIGIN="http://testserver").status_code == 400
    # The portal's own client refuses too, whoever calls it.
    with pytest.raises(PathRefused):
        service_proxy(kube_for(world.cluster), req.project.namespace, req.k8s_name, "http", "../../../../secrets")
    assert client.get(f"/notebooks/{req.pk}/lab/tree/a b.ipynb").status_code == 200

    prefix = f"/api/v1/namespaces/{req.project.namespace}/services/{req.k8s_name}:http/proxy/"
    proxied = [(m, p) for m, p in list(seen) if "/proxy" in p]
    assert proxied and all(p.startswith(prefix + f"notebooks/{req.pk}/") for _, p in proxied), proxied
    assert not [(m, p) for m, p in list(seen) if p in ("/api/v1/secrets", "/api/v1/nodes") or ".." in p
                or "%2e" in p.lower()]
    assert world.sandbox.store.get("v1", "ConfigMap", "not-the-portals", "default")["data"] == {"k": "v"}
