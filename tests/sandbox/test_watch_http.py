"""Watch streams over HTTP: ordering, resume, 410, timeouts, bookmarks, dropped and restarted connections."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from sandbox.app import Sandbox
from sandbox.registry import default_registry
from sandbox.store import Store
from sandbox.testing import api_client, control


def _ns(sb) -> str:
    name = f"w-{uuid.uuid4().hex[:8]}"
    with api_client(sb) as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


def _raw_stream(sb, path: str, timeout: float = 10):
    """Open a raw HTTPS request and return (response, iterator of decoded JSON lines)."""
    u = urlsplit(sb.url)
    ctx = ssl.create_default_context(cadata=sb.ca_pem.decode())
    conn = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=timeout)
    conn.request("GET", path, headers={"Authorization": f"Bearer {sb.token}"})
    resp = conn.getresponse()

    def lines():
        while True:
            line = resp.readline()
            if not line:
                return
            yield json.loads(line)

    return resp, lines()


def test_watch_delivers_every_change_in_order_then_resumes(sandbox_cluster):
    sb = sandbox_cluster
    ns = _ns(sb)
    with api_client(sb) as api:
        v1 = client.CoreV1Api(api)
        start_rv = v1.list_namespaced_config_map(ns).metadata.resource_version
        v1.create_namespaced_config_map(ns, {"metadata": {"name": "w"}, "data": {"n": "0"}})
        for i in range(1, 21):
            v1.patch_namespaced_config_map("w", ns, {"data": {"n": str(i)}})
        v1.delete_namespaced_config_map("w", ns)

        events = []
        for ev in watch.Watch().stream(v1.list_namespaced_config_map, ns, resource_version=start_rv, timeout_seconds=5):
            events.append((ev["type"], ev["object"].data.get("n") if ev["object"].data else None,
                           ev["object"].metadata.resource_version))
            if ev["type"] == "DELETED":
                break
        assert [e[0] for e in events] == ["ADDED"] + ["MODIFIED"] * 20 + ["DELETED"]
        assert [e[1] for e in events[:21]] == [str(i) for i in range(21)]
        rvs = [int(e[2]) for e in events]
        assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)

        # resume from the middle: only the later changes are replayed
        mid_rv = events[10][2]
        resumed = []
        for ev in watch.Watch().stream(v1.list_namespaced_config_map, ns, resource_version=mid_rv, timeout_seconds=5):
            resumed.append(ev["object"].metadata.resource_version)
            if ev["type"] == "DELETED":
                break
        assert resumed == [e[2] for e in events[11:]]


def test_watch_without_resource_version_sends_synthetic_added(sandbox_cluster):
    sb = sandbox_cluster
    ns = _ns(sb)
    with api_client(sb) as api:
        v1 = client.CoreV1Api(api)
        for i in range(3):
            v1.create_namespaced_config_map(ns, {"metadata": {"name": f"s{i}"}, "data": {}})
        got = []
        for ev in watch.Watch().stream(v1.list_namespaced_config_map, ns, timeout_seconds=1):
            got.append((ev["type"], ev["object"].metadata.name))
        assert got == [("ADDED", "s0"), ("ADDED", "s1"), ("ADDED", "s2")]


def test_watch_timeout_seconds_is_honoured(sandbox_cluster):
    sb = sandbox_cluster
    ns = _ns(sb)
    with api_client(sb) as api:
        v1 = client.CoreV1Api(api)
        rv = v1.list_namespaced_config_map(ns).metadata.resource_version
        t0 = time.monotonic()
        assert list(watch.Watch().stream(v1.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=1)) == []
        assert 0.9 <= time.monotonic() - t0 < 5


def test_watch_field_selector_and_raw_wire_format(sandbox_cluster):
    sb = sandbox_cluster
    ns = _ns(sb)
    with api_client(sb) as api:
        v1 = client.CoreV1Api(api)
        v1.create_namespaced_config_map(ns, {"metadata": {"name": "a"}, "data": {}})
        v1.create_namespaced_config_map(ns, {"metadata": {"name": "b"}, "data": {}})
    resp, lines = _raw_stream(sb, f"/api/v1/namespaces/{ns}/configmaps?watch=1&fieldSelector=metadata.name%3Db"
                                  f"&resourceVersion=0&timeoutSeconds=1")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.headers["Transfer-Encoding"] == "chunked"
    events = list(lines)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]
    assert events[0]["object"]["kind"] == "ConfigMap" and events[0]["object"]["apiVersion"] == "v1"


def test_send_initial_events_ends_with_the_bookmark(sandbox_cluster):
    sb = sandbox_cluster
    ns = _ns(sb)
    with api_client(sb) as api:
        client.CoreV1Api(api).create_namespaced_config_map(ns, {"metadata": {"name": "i"}, "data": {}})
    _, lines = _raw_stream(sb, f"/api/v1/namespaces/{ns}/configmaps?watch=true&sendInitialEvents=true"
                               f"&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1")
    events = list(lines)
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "i"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_idle_watch_gets_bookmarks_when_allowed(fresh_sandbox):
    sb = fresh_sandbox
    sb.server.bookmark_interval = 0.2
    ns = _ns(sb)
    with api_client(sb) as api:
        rv = client.CoreV1Api(api).list_namespaced_config_map(ns).metadata.resource_version
    _, lines = _raw_stream(sb, f"/api/v1/namespaces/{ns}/configmaps?watch=true&allowWatchBookmarks=true"
                               f"&resourceVersion={rv}&timeoutSeconds=1")
    events = list(lines)
    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    bm = events[0]["object"]
    assert bm["kind"] == "ConfigMap" and bm["apiVersion"] == "v1" and int(bm["metadata"]["resourceVersion"]) >= int(rv)
    # without allowWatchBookmarks: nothing
    _, lines = _raw_stream(sb, f"/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert list(lines) == []


def test_too_old_resource_version_is_410(tmp_path):
    store = Store(default_registry(), history=10)
    with Sandbox(kubeconfig=tmp_path / "kc", store=store, tick_interval=0) as sb, api_client(sb) as api:
        v1 = client.CoreV1Api(api)
        v1.create_namespace({"metadata": {"name": "old"}})
        first_rv = v1.create_namespaced_config_map("old", {"metadata": {"name": "c"}, "data": {}}).metadata.resource_version
        for i in range(40):
            v1.patch_namespaced_config_map("c", "old", {"data": {"n": str(i)}})
        # the raw wire: HTTP 200 and one ERROR event carrying a 410 Expired Status
        _, lines = _raw_stream(sb, f"/api/v1/namespaces/old/configmaps?watch=true&resourceVersion={first_rv}")
        events = list(lines)
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        status = events[0]["object"]
        assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
        assert "too old resource version" in status["message"]
        # the official client raises ApiException(410) after its single retry
        with pytest.raises(ApiException) as exc:
            for _ in watch.Watch().stream(v1.list_namespaced_config_map, "old", resource_version=first_rv):
                pass
        assert exc.value.status == 410


def test_dropped_watch_is_resumed_by_the_client(fresh_sandbox):
    """With drop_watches_after_s the server ends streams early; watch.Watch() reconnects from the last RV."""
    sb = fresh_sandbox
    ns = _ns(sb)
    control(sb, "PUT", "/sandbox/faults", {"drop_watches_after_s": 0.3})
    with api_client(sb) as api:
        v1 = client.CoreV1Api(api)
        rv = v1.list_namespaced_config_map(ns).metadata.resource_version
        seen: list[str] = []
        done = threading.Event()

        def consume():
            w = watch.Watch()
            for ev in w.stream(v1.list_namespaced_config_map, ns, resource_version=rv):
                seen.append(ev["object"].metadata.name)
                if len(seen) == 12:
                    w.stop()
            done.set()

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        for i in range(12):
            v1.create_namespaced_config_map(ns, {"metadata": {"name": f"d{i:02d}"}, "data": {}})
            time.sleep(0.1)
        assert done.wait(15)
    assert seen == [f"d{i:02d}" for i in range(12)]


def test_reset_mode_cuts_the_watch_connection(fresh_sandbox):
    sb = fresh_sandbox
    ns = _ns(sb)
    control(sb, "PUT", "/sandbox/faults", {"drop_watches_after_s": 0.3, "drop_watches_mode": "reset"})
    with api_client(sb) as api:
        v1 = client.CoreV1Api(api)
        rv = v1.list_namespaced_config_map(ns).metadata.resource_version
        t0 = time.monotonic()
        with pytest.raises(Exception) as exc:  # urllib3 ProtocolError: the response ended prematurely
            for _ in watch.Watch().stream(v1.list_namespaced_config_map, ns, resource_version=rv):
                pass
        assert time.monotonic() - t0 < 5
    assert not isinstance(exc.value, ApiException)


def test_restart_drops_open_watches(fresh_sandbox):
    sb = fresh_sandbox
    _ns(sb)
    resp, lines = _raw_stream(sb, "/api/v1/namespaces?watch=true&resourceVersion=0", timeout=10)
    first = next(lines)
    assert first["type"] == "ADDED"
    status, _, _ = control(sb, "POST", "/sandbox/restart")
    assert status == 200
    t0 = time.monotonic()
    with pytest.raises((http.client.IncompleteRead, ConnectionError, ssl.SSLError, OSError, StopIteration, ValueError)):
        while True:
            next(lines)
            assert time.monotonic() - t0 < 10
