"""The sandbox's simulated DCGM exporter and Prometheus query API (sandbox/dcgm.py), over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandbox.app import Sandbox
from sandbox.controllers.sim import GPU_TOLERATION, Sim
from sandbox.dcgm import METRIC_NAMES, SCRAPE_SECONDS
from sandbox.profile import load_profile

LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


@pytest.fixture
def sb():
    profile = load_profile(None)
    profile["usage"] = {"byKind": {"notebook": "idle"}, "xid": [{"node": "gpu-h100-3", "gpu": 5, "code": 48}]}
    s = Sandbox(profile=profile, speed=0, tick_interval=0, token="secret", tls=False).start()
    s.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}}, field_manager="test")
    try:
        yield s
    finally:
        s.stop()


def run_job(sb: Sandbox, name: str, *, usage: str | None = None, kind: str | None = None, gpus: int = 1,
            resource: str = "nvidia.com/gpu") -> dict:
    job = Sim.job(name, "t", requests={resource: gpus, "cpu": 1}, duration="86400", tolerations=[GPU_TOLERATION])
    meta = job["spec"]["template"].setdefault("metadata", {})
    if usage:
        meta.setdefault("annotations", {})["sandbox.gpuportal.dev/usage"] = usage
    if kind:
        meta.setdefault("labels", {})["gpuportal.dev/kind"] = kind
    sb.store.create(job, field_manager="test")
    sb.advance(5)
    sb.advance(5)  # bound, then started
    pod = next(p for p in sb.store.list("v1", "Pod", "t")["items"] if p["metadata"]["name"].startswith(name + "-"))
    assert pod["status"]["phase"] == "Running"
    return pod


def get(sb: Sandbox, path: str, **params: str) -> tuple[int, str]:
    url = f"{sb.http_url}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url) as resp:  # no bearer token: these are public, as in a cluster
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def query(sb: Sandbox, expr: str, **params: str) -> dict:
    code, body = get(sb, "/prometheus/api/v1/query", query=expr, **params)
    assert code == 200, body
    return json.loads(body)["data"]


def test_exporter_text_parses_with_prometheus_client_and_labels_the_pod(sb) -> None:
    pod = run_job(sb, "train", usage="light")
    node = pod["spec"]["nodeName"]
    code, text = get(sb, f"/dcgm/{node}/metrics")
    assert code == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == set(METRIC_NAMES)
    util = families["DCGM_FI_DEV_GPU_UTIL"]
    assert util.type == "gauge" and len(util.samples) == 8  # one per GPU of the H100 node
    held = [s for s in util.samples if s.labels.get("pod")]
    assert len(held) == 1 and held[0].labels["pod"] == pod["metadata"]["name"]
    assert held[0].labels["namespace"] == "t" and held[0].labels["container"] == "main"
    assert set(held[0].labels) >= LABELS and held[0].labels["Hostname"] == node
    assert held[0].labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert 30 <= held[0].value <= 50  # the memory-light profile
    used = next(s for s in families["DCGM_FI_DEV_FB_USED"].samples if s.labels.get("pod"))
    free = next(s for s in families["DCGM_FI_DEV_FB_FREE"].samples if s.labels.get("pod"))
    assert 8700 <= used.value <= 9318 and used.value + free.value == pytest.approx(81559, abs=1)
    assert get(sb, "/dcgm/cpu-0/metrics")[0] == 404 and get(sb, "/dcgm/nope/metrics")[0] == 404


def test_mig_instances_are_series_of_their_own(sb) -> None:
    pod = run_job(sb, "slice", usage="idle", resource="nvidia.com/mig-1g.10gb")
    _, text = get(sb, f"/dcgm/{pod['spec']['nodeName']}/metrics")
    fb = {f.name: f for f in text_string_to_metric_families(text)}["DCGM_FI_DEV_FB_FREE"]
    mine = [s for s in fb.samples if s.labels.get("pod") == pod["metadata"]["name"]]
    assert len(mine) == 1 and mine[0].labels["GPU_I_PROFILE"] == "1g.10gb" and mine[0].labels["GPU_I_ID"]


def test_query_api_answers_as_prometheus_for_the_subset(sb) -> None:
    light = run_job(sb, "light", usage="light")
    idle = run_job(sb, "nb", kind="notebook")  # the profile's byKind: idle
    sb.advance(600)
    now = sb.clock.now().timestamp()
    data = query(sb, 'max by (namespace, pod) (max_over_time(DCGM_FI_DEV_FB_USED{namespace="t"}[5m]))',
                 time=str(now))
    assert data["resultType"] == "vector"
    got = {r["metric"]["pod"]: float(r["value"][1]) for r in data["result"]}
    assert set(got) == {light["metadata"]["name"], idle["metadata"]["name"]}
    assert all(set(r["metric"]) == {"namespace", "pod"} for r in data["result"])  # by() keeps only its labels
    assert got[idle["metadata"]["name"]] == 1230 and 8700 <= got[light["metadata"]["name"]] <= 9318
    assert data["result"][0]["value"][0] == pytest.approx(now)
    # avg_over_time is the mean of the scrapes in the window, as the raw samples show
    sel = f'DCGM_FI_DEV_GPU_UTIL{{pod="{light["metadata"]["name"]}"}}'
    raw = query(sb, sel + "[5m]", time=str(now))
    assert raw["resultType"] == "matrix"
    values = [float(v) for _, v in raw["result"][0]["values"]]
    assert len(values) == 300 // SCRAPE_SECONDS
    avg = query(sb, f"avg_over_time({sel}[5m])", time=str(now))["result"][0]
    assert float(avg["value"][1]) == pytest.approx(sum(values) / len(values))
    assert "__name__" not in avg["metric"] and avg["metric"]["job"] == "dcgm-exporter"
    # an instant selector keeps the metric name; regex matchers; a range query is a matrix with one value per step
    inst = query(sb, 'DCGM_FI_DEV_XID_ERRORS{Hostname=~"gpu-h100-.*",gpu="5"}')["result"]
    assert {r["metric"]["__name__"] for r in inst} == {"DCGM_FI_DEV_XID_ERRORS"}
    assert {r["metric"]["Hostname"]: r["value"][1] for r in inst}["gpu-h100-3"] == "48"  # the configured fault
    code, body = get(sb, "/prometheus/api/v1/query_range", query=f"avg_over_time({sel}[5m])",
                     start=str(now - 300), end=str(now), step="150s")
    assert code == 200
    matrix = json.loads(body)["data"]
    assert matrix["resultType"] == "matrix" and len(matrix["result"][0]["values"]) == 3


def test_xid_profile_raises_79_after_ten_minutes(sb) -> None:
    pod = run_job(sb, "bad", usage="xid")
    sel = f'DCGM_FI_DEV_XID_ERRORS{{pod="{pod["metadata"]["name"]}"}}'
    sb.advance(SCRAPE_SECONDS)  # scraped once since it started
    assert query(sb, sel)["result"][0]["value"][1] == "0"
    sb.advance(660)
    assert query(sb, sel)["result"][0]["value"][1] == "79"
    assert query(sb, f'DCGM_FI_DEV_GPU_UTIL{{pod="{pod["metadata"]["name"]}"}}')["result"][0]["value"][1] == "0"


@pytest.mark.parametrize("params", [
    {"query": "rate(DCGM_FI_DEV_GPU_UTIL[5m])"},  # outside the subset
    {"query": "avg_over_time(DCGM_FI_DEV_GPU_UTIL)"},  # needs a range
    {"query": '{pod=""}'},  # matches everything
    {"query": ""},
    {"query": "DCGM_FI_DEV_GPU_UTIL", "time": "yesterday"},
])
def test_bad_queries_are_400_bad_data(sb, params) -> None:
    code, body = get(sb, "/prometheus/api/v1/query", **params)
    assert code == 400
    doc = json.loads(body)
    assert doc["status"] == "error" and doc["errorType"] == "bad_data" and doc["error"]


def test_range_query_refuses_bad_steps(sb) -> None:
    for step, start, end in (("0", "0", "10"), ("1", "0", "100000"), ("10", "10", "0")):
        code, body = get(sb, "/prometheus/api/v1/query_range", query="DCGM_FI_DEV_GPU_UTIL", start=start, end=end,
                         step=step)
        assert code == 400 and json.loads(body)["errorType"] == "bad_data"


def test_one_query_api_for_two_sandboxes_with_their_cluster_labels() -> None:
    """The profile's ``prometheus`` section: ``externalLabels`` on every series this sandbox's Prometheus scraped,
    ``peers`` whose series its query API answers with too (their own only: ``local=1``)."""
    b = Sandbox(profile=load_profile(None) | {"prometheus": {"externalLabels": {"cluster": "b"}}},
                speed=0, tick_interval=0, token="secret", tls=False).start()
    try:
        a = Sandbox(profile=load_profile(None) | {"prometheus": {"externalLabels": {"cluster": "a"}, "peers": [b.http_url]}},
                    speed=0, tick_interval=0, token="secret", tls=False).start()
        try:
            a.advance(60)
            b.advance(60)
            both = query(a, "count by (cluster) (DCGM_FI_DEV_GPU_UTIL)")["result"]
            counts = {r["metric"]["cluster"]: int(r["value"][1]) for r in both}
            assert set(counts) == {"a", "b"} and counts["a"] == counts["b"] > 0
            mine = query(a, "count by (cluster) (DCGM_FI_DEV_GPU_UTIL)", local="1")["result"]
            assert [r["metric"]["cluster"] for r in mine] == ["a"]
            assert {r["metric"]["cluster"] for r in query(b, "count by (cluster) (DCGM_FI_DEV_GPU_UTIL)")["result"]} == {"b"}
        finally:
            a.stop()
    finally:
        b.stop()


def test_the_command_line_sets_the_label_and_peers(tmp_path) -> None:
    """``python -m sandbox --prometheus-label NAME=VALUE --prometheus-peer URL`` (as ``make run`` starts the demo's
    clusters); a label without ``=`` is refused with a message."""
    import socket
    import subprocess
    import sys
    import time

    bad = subprocess.run([sys.executable, "-m", "sandbox", "--kubeconfig", str(tmp_path / "x"), "--prometheus-label",
                          "cluster"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--prometheus-label takes NAME=VALUE, not 'cluster'" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "sandbox", "--kubeconfig", str(tmp_path / "x"), "--xid", "gpu-h100-3:x"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--xid takes NODE:GPU[:CODE[:AFTER_SECONDS]]" in bad.stderr
    peer = Sandbox(profile=load_profile(None), speed=0, tick_interval=0, token="secret", tls=False).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "sandbox", "--kubeconfig", str(kubeconfig), "--port", str(port),
                             "--prometheus-label", "cluster=main", "--prometheus-peer", peer.http_url,
                             "--xid", "gpu-h100-3:7:48", "--tick-interval", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not kubeconfig.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/prometheus/api/v1/query?" + urllib.parse.urlencode(
            {"query": "count by (cluster) (DCGM_FI_DEV_GPU_UTIL)"})
        with urllib.request.urlopen(url) as resp:
            found = {r["metric"].get("cluster", "") for r in json.loads(resp.read())["data"]["result"]}
        assert found == {"main", ""}  # its own series labelled; the peer's as the peer labels them (not at all)
        url = f"http://127.0.0.1:{port}/prometheus/api/v1/query?" + urllib.parse.urlencode(
            {"query": 'max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS{cluster="main"})'})
        with urllib.request.urlopen(url) as resp:
            raised = {(r["metric"]["Hostname"], r["metric"]["gpu"]): r["value"][1]
                      for r in json.loads(resp.read())["data"]["result"] if float(r["value"][1])}
        assert raised == {("gpu-h100-3", "7"): "48"}  # --xid: that GPU alone, with its code
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        peer.stop()
