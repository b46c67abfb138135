"""portal/kube.py and portal/crypto.py against the sandbox: errors, pagination, watch, encrypted kubeconfigs."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import yaml

from portal.crypto import InvalidToken, decrypt, encrypt
from portal.kube import ClusterRejected, ClusterUnavailable, Kube, kube_cache_clear, kube_for
from quotas.models import Cluster
from sandbox.testing import control

KUEUE = "kueue.x-k8s.io/v1beta2"


def flavor(name: str, **spec) -> dict:
    return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name, "labels": {"t": "kube"}}, "spec": spec}


def test_crypto_round_trip_and_tamper(settings) -> None:
    token = encrypt("apiVersion: v1\nkind: Config\n")
    assert token != "apiVersion" and decrypt(token) == "apiVersion: v1\nkind: Config\n"
    with pytest.raises(InvalidToken):
        decrypt(token[:-4] + "AAAA")
    settings.PORTAL_ENCRYPTION_KEY = "lqP5mmHnOp6jdYKwGvG4xGNRXNFlVK3yaMfpbIEuQ3w="
    with pytest.raises(InvalidToken):
        decrypt(token)  # another key cannot read it
    assert decrypt(encrypt("x")) == "x"


def test_verbs_errors_and_pagination(fresh_sandbox) -> None:
    kube = Kube(kubeconfig_path=str(fresh_sandbox.kubeconfig))
    created = kube.apply(flavor("a", nodeLabels={"x": "y"}))
    assert created["metadata"]["name"] == "a" and kube.get(KUEUE, "ResourceFlavor", "a")["spec"] == {"nodeLabels": {"x": "y"}}
    assert kube.get(KUEUE, "ResourceFlavor", "missing") is None
    assert kube.apply(flavor("dry"), dry_run=True) and kube.get(KUEUE, "ResourceFlavor", "dry") is None
    for i in range(1203):  # more than two pages of 500
        fresh_sandbox.store.create(flavor(f"f{i:04d}"))
    items, version = kube.list(KUEUE, "ResourceFlavor", label_selector="t=kube")
    assert len(items) == 1204 and version and kube.calls["list"] == 3
    with pytest.raises(ClusterRejected) as rejected:
        kube.apply(flavor("bad", nodeTaints=[{"key": "k", "value": "v", "effect": "Sometimes"}]))
    assert rejected.value.status == 422 and rejected.value.reason == "Invalid"
    assert any(f.startswith("spec.nodeTaints") for f in rejected.value.fields)
    with pytest.raises(ClusterRejected) as unknown:
        kube.get("example.com/v1", "Nothing", "x")
    assert unknown.value.status == 404
    assert kube.delete(KUEUE, "ResourceFlavor", "a") is True
    assert kube.delete(KUEUE, "ResourceFlavor", "a") is False  # already gone counts as done


def test_unavailable_carries_retry_after(fresh_sandbox) -> None:
    kube = Kube(kubeconfig_path=str(fresh_sandbox.kubeconfig))
    kube.resource(KUEUE, "ResourceFlavor")  # discovery before the faults
    control(fresh_sandbox, "PUT", "/sandbox/faults", {"error_rate": 1.0, "error_codes": [429], "retry_after": 7})
    try:
        with pytest.raises(ClusterUnavailable) as exc:
            kube.get(KUEUE, "ResourceFlavor", "x")
        assert exc.value.status == 429 and exc.value.retry_after == 7
    finally:
        control(fresh_sandbox, "PUT", "/sandbox/faults", {"error_rate": 0.0})


def test_connection_refused_is_unavailable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
              "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    kube = Kube(kubeconfig_text=yaml.safe_dump(config))
    with pytest.raises(ClusterUnavailable):
        kube.list("v1", "Node")


def test_watch_yields_events(fresh_sandbox) -> None:
    kube = Kube(kubeconfig_path=str(fresh_sandbox.kubeconfig))
    _, version = kube.list(KUEUE, "ResourceFlavor")
    threading.Timer(0.3, lambda: fresh_sandbox.store.create(flavor("watched"))).start()
    for etype, obj in kube.watch(KUEUE, "ResourceFlavor", resource_version=version, timeout_seconds=5):
        if etype == "ADDED" and obj["metadata"]["name"] == "watched":
            break
    else:
        pytest.fail("no ADDED event")


@pytest.mark.django_db
def test_kube_for_reads_an_encrypted_kubeconfig_and_caches(fresh_sandbox) -> None:
    kube_cache_clear()
    text = Path(fresh_sandbox.kubeconfig).read_text()
    cluster = Cluster.objects.create(name="enc", kubeconfig_encrypted=encrypt(text))
    assert "token" not in cluster.kubeconfig_encrypted
    kube = kube_for(cluster)
    assert kube is kube_for(cluster)
    assert len(kube.list("v1", "Node")[0]) == 10  # demo profile: 8 GPU + 2 CPU nodes
    by_path = Cluster.objects.create(name="path", kubeconfig_path=str(fresh_sandbox.kubeconfig))
    assert kube_for(by_path) is not kube
    with pytest.raises(ValueError):
        kube_for(Cluster.objects.create(name="none"))


def test_pod_log_reads_the_tail(fresh_sandbox) -> None:
    kube = Kube(kubeconfig_path=str(fresh_sandbox.kubeconfig))
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "logs"}})
    kube.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "logs",
                "annotations": {"sandbox.gpuportal.dev/duration": "60s"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}})
    fresh_sandbox.advance(120)
    text = kube.pod_log("logs", "p", tail_lines=50)
    assert isinstance(text, str) and text.strip(), text
    assert kube.pod_log("logs", "missing") is None
