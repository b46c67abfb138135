"""The sandbox's model servers: the HorizontalPodAutoscaler's rule, and rolling updates that keep a replica ready
(sandbox/inference.py, the Deployment controller)."""

from __future__ import annotations

import pytest

from sandbox.controllers.sim import GPU_TOLERATION, Sim
from sandbox.inference import answer

from .test_controllers_workloads import deployment


@pytest.fixture
def sim() -> Sim:
    s = Sim()
    s.namespace("t")
    return s


def _hpa(low: int, top: int, target: str) -> dict:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "web", "namespace": "t"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                     "minReplicas": low, "maxReplicas": top,
                     "metrics": [{"type": "Pods", "pods": {"metric": {"name": "http_requests_per_second"},
                                                           "target": {"type": "AverageValue", "averageValue": target}}}],
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}}}


def test_the_autoscaler_follows_the_request_rate_between_its_bounds(sim) -> None:
    sim.create(deployment("web", 1))
    sim.create(_hpa(1, 4, "100m"))  # 0.1 request per second per replica: 6 a minute
    sim.settle()
    replicas = lambda: sim.get("apps/v1", "Deployment", "web", "t")["spec"]["replicas"]
    assert replicas() == 1
    load = sim.controllers.inference_load
    for _ in range(15):  # 15 in a minute: 0.25/s, 2.5 replicas' worth
        load.record("t", "web")
    sim.settle()
    assert replicas() == 3
    hpa = sim.get("autoscaling/v2", "HorizontalPodAutoscaler", "web", "t")
    assert hpa["status"]["desiredReplicas"] == 3 and hpa["status"]["lastScaleTime"]
    for _ in range(60):  # far more: held to the maximum
        load.record("t", "web")
    sim.settle()
    assert replicas() == 4
    sim.advance(120)  # quiet for two minutes: the load is gone, but scale-down waits for the window
    assert replicas() == 4
    sim.advance(300)
    assert replicas() == 1  # never below the minimum


def test_a_rolling_update_with_max_unavailable_0_keeps_the_old_replica_until_the_new_one_is_ready(sim) -> None:
    dep = deployment("web", 1)
    dep["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    sim.create(dep)
    sim.settle()
    sim.advance(5)
    (old,) = sim.pods("t", "app=web")
    assert old["status"]["phase"] == "Running"
    # A new image: the template changes.
    containers = dep["spec"]["template"]["spec"]["containers"]
    containers[0]["image"] = "vllm/vllm-openai:v0.13.0"
    sim.patch("apps/v1", "Deployment", "web", "t", {"spec": {"template": {"spec": {"containers": containers,
                                                                                     "tolerations": [GPU_TOLERATION]}}}})
    sim.settle()
    names = {p["metadata"]["name"] for p in sim.pods("t", "app=web")}
    assert old["metadata"]["name"] in names and len(names) == 2  # the old one serves while the new one starts
    sim.advance(30)
    (new,) = sim.pods("t", "app=web")
    assert new["metadata"]["name"] != old["metadata"]["name"]


def test_the_openai_answers_are_deterministic() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 1, 1, tzinfo=UTC)
    code, models = answer("GET", "v1/models", b"", "org/m", now)
    assert code == 200 and models["data"][0]["id"] == "org/m"
    body = b'{"prompt": "hi", "max_tokens": 4}'
    first, second = answer("POST", "v1/completions", body, "org/m", now), answer("POST", "v1/completions", body, "org/m", now)
    assert first == second and first[0] == 200 and len(first[1]["choices"][0]["text"].split()) == 4
    assert answer("POST", "v1/completions", b'{"prompt": "other", "max_tokens": 4}', "org/m", now) != first
    assert answer("POST", "v1/completions", b"[1]", "org/m", now)[0] == 400
    assert answer("GET", "api/v1/secrets", b"", "org/m", now)[0] == 404
