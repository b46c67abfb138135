"""A fourth kind, batch inference, added as one module (``workloads/kinds/batch_inference.py``) plus its choice's
migration: followed end to end through the real interfaces. The form offers it with its own fields, the API submits
it, the Celery worker materializes it on the sandbox cluster, the status follower sees it run and finish, billing
meters it like training and prices it, and the scheduling metrics count it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client

from billing import services as billing_services
from billing.models import UsageInterval
from insights.registry import METRICS, Query
from tenants.access import scope_of
from workloads import kinds
from workloads.models import RequestState, WorkloadRequest

from .test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures

S = RequestState
API = "/api/v1"
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]


@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:  # noqa: F811 - the fixture imported above
    world = _world(fresh_sandbox, cast, architecture="B")
    billing_services.price_create(actor=cast.actor("ops"), unit="gpu", key="h100-80gb", amount=Decimal("3.60"),
                                  effective_from=datetime(2020, 1, 1, tzinfo=UTC))
    return world


def test_the_fourth_kind_is_registered_with_its_traits() -> None:
    kind = kinds.get("batchinfer")
    assert kinds.names()[-1] == "batchinfer"
    assert not (kind.interactive or kind.scalable or kind.proxied or kind.gang or kind.serving)
    assert kind.billed_pods(1, {}) == 1 and kind.storage_gib({"dataset_volume": "inputs"}) == 0
    assert kind.follows == ("job",) and kind.default_priority == "batch"


def test_batch_inference_from_the_form_to_the_metrics(world: World, api) -> None:
    carol = Client()
    carol.force_login(world.cast.carol)
    page = carol.get("/requests/new/?template=batch-inference&project=acme-vision")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Dataset volume" in html and "Input file" in html and "model_uri" in html

    bad = api("carol").post(f"{API}/requests/", {
        "project": "acme-vision", "template": "batch-inference", "flavor": "h100-80gb-offline", "gpus": 1,
        "duration_hours": 1, "image": "vllm/vllm-openai:v0.12.0", "parameters": {"dataset_volume": "inputs"},
    }, format="json")
    assert bad.status_code == 400 and "model_uri" in str(bad.json()), bad.content  # the schema's required field

    response = api("carol").post(f"{API}/requests/", {
        "project": "acme-vision", "template": "batch-inference", "flavor": "h100-80gb-offline", "gpus": 1,
        "duration_hours": 1, "image": "vllm/vllm-openai:v0.12.0",
        "parameters": {"model_uri": "hf://org/model", "dataset_volume": "inputs"},
    }, format="json")
    assert response.status_code == 201, response.content
    req = WorkloadRequest.objects.get(pk=response.json()["id"])
    assert req.template.kind == "batchinfer" and req.priority == "batch"
    if req.state == S.PENDING_APPROVAL:
        req = world.approve(req)

    req = world.wait(req, lambda r: r.state in (S.QUEUED, S.RUNNING), timeout=30)  # the worker applied it
    assert world.objects(req) == {"batch/v1/Job": 1}
    job = world.sandbox.store.get("batch/v1", "Job", req.k8s_name, req.project.namespace)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"][:3] == ["python", "-m", "vllm.entrypoints.openai.run_batch"]
    assert pod["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "inputs"}}]

    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    intervals = list(UsageInterval.objects.filter(request=req, unit="gpu"))
    assert len(intervals) == 1 and intervals[0].quantity == 1 and intervals[0].ended_at is None
    req = world.wait(req, lambda r: r.state == S.SUCCEEDED, advance=1800)
    world.sync()
    assert UsageInterval.objects.get(request=req, unit="gpu").ended_at is not None
    assert Decimal(api("carol").get(f"{API}/requests/{req.pk}/").json()["cost_so_far"]) > 0

    now = datetime.now(UTC)
    query = Query(scope=scope_of(world.cast.actor("ops")), start=now - timedelta(days=1), end=now + timedelta(days=1),
                  group_by="project")
    rows = {r.group: r.values for r in METRICS["queue-wait"].compute(query).rows}
    assert rows["acme-vision"]["admitted"] == 1
