"""The request lifecycle end to end: services → Celery worker (real, over the configured broker) → sandbox
cluster (over loopback, through portal.kube) → status follower → request states.

Each test gets a fresh sandbox cluster (the demo profile's nodes), reconciles the quota objects into it
(quotas.reconcile), seeds the catalogue, and drives time with the sandbox clock. Materialization runs in the
Celery worker; the status follower runs one cycle at a time in the test (``requests_sync``), as beat would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connection, connections
from django.utils import timezone

from portal.celery import app
from portal.kube import kube_cache_clear, kube_for
from quotas.inventory import flavors_discover, inventory_sync, node_taints
from quotas.models import Cluster, Flavor, Quota
from quotas.reconcile import reconcile
from tenants.access import Actor
from workloads import services
from workloads.catalogue import seed_catalogue
from workloads.manifests import REQUEST_LABEL
from workloads.materialize import PAUSE_AFTER_APPLY_ENV, notebooks_cull_idle, request_materialize
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest
from workloads.status import requests_sync
from workloads.tasks import request_materialize_task

S = RequestState
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(240)]
IMAGE = "nvcr.io/nvidia/pytorch:26.10-py3"


@dataclass
class World:
    sandbox: Any
    cluster: Cluster
    flavors: dict[str, Flavor]
    templates: dict[str, ServiceTemplate]
    cast: Any

    def kube(self):
        return kube_for(self.cluster)

    def sync(self) -> None:
        requests_sync(cluster=self.cluster, watch_seconds=1)

    def wait(self, req: WorkloadRequest, predicate: Callable[[WorkloadRequest], bool], *, timeout: float = 40,
             advance: float = 0, also: WorkloadRequest | None = None) -> WorkloadRequest:
        """Run follower cycles (moving simulated time by ``advance`` each) until ``predicate`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            req.refresh_from_db()
            if predicate(req):
                return req
            if time.monotonic() > deadline:
                other = ""
                if also is not None:
                    also.refresh_from_db()
                    other = f"\nalso {also.pk} {also.state}: {also.state_reason} / {also.pending_reason} {also.cluster_status}"
                raise AssertionError(f"request {req.pk} stuck in {req.state}: {req.state_reason} / {req.pending_reason}\n"
                                     f"{req.cluster_status}\n{list(req.events.values_list('from_state', 'to_state', 'message'))}"
                                     + other)
            if advance:
                self.sandbox.advance(advance)
            self.sync()

    def submit(self, who: str, template: str, flavor: str, *, project: Any = None, **values: Any) -> WorkloadRequest:
        params = values.pop("parameters", None) or {
            "training": {"command": "python train.py"}, "inference": {"model_uri": "hf://org/model"}, "notebook": {},
        }[template]
        return services.request_submit(
            actor=Actor(user=getattr(self.cast, who)), project=project or self.cast.vision, template=self.templates[template],
            image=values.pop("image", IMAGE if template != "inference" else "vllm/vllm-openai:v0.12.0"),
            flavor=self.flavors[flavor], parameters=params, **values,
        )

    def approve(self, req: WorkloadRequest) -> WorkloadRequest:
        return services.request_approve(actor=Actor(user=self.cast.bob), request=req, comment="ok")

    def objects(self, req: WorkloadRequest) -> dict[str, int]:
        """How many objects of each kind the cluster holds for ``req`` (by our request label)."""
        out: dict[str, int] = {}
        store = self.sandbox.store
        for api_version, kind in (("batch/v1", "Job"), ("batch.volcano.sh/v1alpha1", "Job"), ("apps/v1", "Deployment"),
                                  ("apps/v1", "StatefulSet"), ("v1", "Service"), ("v1", "Secret")):
            items = store.list(api_version, kind, req.project.namespace, label_selector=f"{REQUEST_LABEL}={req.pk}")["items"]
            if items:
                out[f"{api_version}/{kind}"] = len(items)
        return out


def _world(sandbox: Any, cast: Any, *, architecture: str, gpus: int = 8) -> World:
    kube_cache_clear()
    cluster = Cluster.objects.create(name=f"sandbox-{architecture.lower()}", architecture=architecture,
                                     kubeconfig_path=str(sandbox.kubeconfig), use_mig=True, use_hami=True)
    kube = kube_for(cluster)
    inventory_sync(cluster, kube=kube)
    for flavor in flavors_discover(cluster, taints_by_node=node_taints(kube)):
        flavor.save()
    flavors = {f.name: f for f in Flavor.objects.filter(cluster=cluster)}
    for flavor in flavors.values():
        for resource in flavor.resource_names:
            amount = {"cpu": 400, "memory": 4000}.get(resource, gpus)
            if resource.startswith("nvidia.com/total-gpu"):
                amount = 100 * gpus if "cores" in resource else 46068 * gpus
            Quota.objects.create(tenant=cast.acme, flavor=flavor, resource=resource, nominal=Decimal(amount * 2))
            Quota.objects.create(tenant=cast.acme, project=cast.vision, flavor=flavor, resource=resource,
                                 nominal=Decimal(amount), borrowing_limit=Decimal(0))
    seed_catalogue()
    templates = {t.slug: t for t in ServiceTemplate.objects.all()}
    for template in templates.values():
        template.allowed_flavors.set(flavors.values())
    result = reconcile(cluster, kube=kube)
    assert result.ok, result
    return World(sandbox, cluster, flavors, templates, cast)


@pytest.fixture(scope="module")
def celery_worker_thread() -> Iterator[None]:
    """One real worker for the module. (A worker per test would leave the previous one's blocking pop on the
    Redis queue behind, which can swallow the next test's first message.)"""
    # A queue of our own: no other test process's worker (another xdist worker, another checkout's run on the
    # same Redis) can take our tasks to its own database, and ours takes none of theirs.
    queue = _queue()
    app.conf.task_routes = {"workloads.tasks.*": {"queue": queue}}
    app.amqp.flush_routes()
    app.amqp.__dict__.pop("router", None)
    with app.connection_for_write() as conn:  # what an earlier module's tests set off and left unread
        conn.default_channel.client.delete(*_queue_keys(queue))
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=20,
                          queues=[queue]):
            yield
    finally:
        app.conf.task_routes = None
        app.amqp.flush_routes()
        app.amqp.__dict__.pop("router", None)


def _queue() -> str:
    return f"lifecycle-{os.getpid()}"


def _queue_keys(queue: str) -> list[str]:
    """The Redis lists behind one queue: kombu keeps one per priority step beside the plain one."""
    return [queue] + [f"{queue}\x06\x16{step}" for step in range(1, 10)]


def _wait_until_idle(timeout: float = 30.0) -> None:
    """Wait until the worker has nothing queued, reserved or running, for a moment in a row.

    A test's last action (a stop, a cancel) sets off a task after the test's own checks are done. Flushing
    the database while that task still holds rows can deadlock the flush, and a task left over runs in the
    next test with the database closed to it."""
    from celery.worker import state as worker_state

    keys = _queue_keys(_queue())
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    with app.connection_for_read() as conn:
        client = conn.default_channel.client
        while time.monotonic() < deadline:
            busy = worker_state.active_requests or worker_state.reserved_requests or any(client.llen(k) for k in keys)
            now = time.monotonic()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= 0.3:
                return
            time.sleep(0.05)


@pytest.fixture
def worker(celery_worker_thread, transactional_db) -> Iterator[None]:
    yield
    _wait_until_idle()
    connections.close_all()


@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:
    return _world(fresh_sandbox, cast, architecture="B")


def _states(req: WorkloadRequest) -> list[str]:
    """The request's path from its approval on (the timeline's state changes)."""
    path = [to for _, to in req.events.order_by("at", "id").values_list("from_state", "to_state") if to]
    return path[path.index(S.APPROVED):]


# ------------------------------------------------------------------------------------------------ lifecycles
def test_training_job_runs_to_success(world: World) -> None:
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    req = world.wait(req, lambda r: r.state in (S.QUEUED, S.RUNNING), timeout=30)  # materialized by the worker
    assert world.objects(req) == {"batch/v1/Job": 1}
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    workload = next(v for k, v in req.cluster_status["objects"].items() if k.startswith("workload/"))
    assert workload["c"]["Admitted"][0] == "True"
    assert req.expires_at is not None
    req = world.wait(req, lambda r: r.state == S.SUCCEEDED, advance=1800)
    assert _states(req) == [S.APPROVED, S.QUEUED, S.RUNNING, S.SUCCEEDED]
    assert req.pending_reason == ""


def test_failing_training_job_fails(world: World) -> None:
    req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    req = world.wait(req, lambda r: r.state in (S.QUEUED, S.RUNNING))
    # The sandbox's outcome annotation makes the simulated container exit 1 (sandbox/CONTRACT.md).
    # Pods may exist already: they get it too (the kubelet reads it when the run ends).
    failed = {"metadata": {"annotations": {"sandbox.gpuportal.dev/outcome": "Failed"}}}
    store = world.sandbox.store
    store.patch("batch/v1", "Job", req.k8s_name, req.project.namespace, failed, "merge")
    for pod in store.list("v1", "Pod", req.project.namespace, label_selector=f"{REQUEST_LABEL}={req.pk}")["items"]:
        store.patch("v1", "Pod", pod["metadata"]["name"], req.project.namespace, failed, "merge")
    req = world.wait(req, lambda r: r.state == S.FAILED, advance=1800)
    assert "Failed" in req.state_reason or "fail" in req.state_reason.lower()


def test_notebook_runs_and_is_stopped(world: World) -> None:
    req = world.submit("carol", "notebook", "h100-80gb-offline", gpus=1, duration_hours=4)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    assert world.objects(req) == {"apps/v1/StatefulSet": 1, "v1/Service": 1, "v1/Secret": 1}
    services.request_stop(actor=Actor(user=world.cast.carol), request=req)
    deadline = time.monotonic() + 30
    while world.objects(req) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert world.objects(req) == {}
    # The home volume stays for a restart.
    claims = world.sandbox.store.list("v1", "PersistentVolumeClaim", req.project.namespace)["items"]
    assert any(c["metadata"]["name"] == f"home-{req.k8s_name}-0" for c in claims)
    req.refresh_from_db()
    assert req.state == S.STOPPED


def test_idle_notebook_is_culled(world: World, mailoutbox) -> None:
    req = world.submit("carol", "notebook", "h100-80gb-offline", gpus=1, duration_hours=4)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    timeout = req.template.idle_timeout_minutes
    # Started a while ago, last used longer ago than the timeout (activity only counts after the start).
    WorkloadRequest.objects.filter(pk=req.pk).update(started_at=timezone.now() - timedelta(minutes=timeout + 30),
                                                     last_active_at=timezone.now() - timedelta(minutes=timeout + 5))
    assert notebooks_cull_idle(timezone.now()) == 1
    req.refresh_from_db()
    assert req.state == S.STOPPED
    assert "without activity" in req.state_reason
    assert world.objects(req) == {}
    assert len(mailoutbox) == 1 and "stopped" in mailoutbox[0].subject


def test_inference_service_runs_until_stopped(world: World) -> None:
    req = world.submit("carol", "inference", "h100-80gb-offline", gpus=1, duration_hours=4, replicas=2)
    assert req.state == S.PENDING_APPROVAL  # inference needs a project admin
    req = world.approve(req)
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    assert world.objects(req) == {"apps/v1/Deployment": 1, "v1/Service": 1}
    services.request_scale(actor=Actor(user=world.cast.bob), request=req, replicas=1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        deploy = world.sandbox.store.get("apps/v1", "Deployment", req.k8s_name, req.project.namespace)
        if deploy["spec"]["replicas"] == 1:
            break
        time.sleep(0.2)
    assert deploy["spec"]["replicas"] == 1
    services.request_stop(actor=Actor(user=world.cast.carol), request=req)


def test_preempted_training_job_is_requeued_and_runs_again(world: World) -> None:
    # The project holds 8 offline H100s; an 8-GPU batch job fills them, then an interactive notebook
    # (higher priority) preempts it. When the notebook stops, the job is admitted again and finishes.
    job = world.submit("bob", "training", "h100-80gb-offline", gpus=8, duration_hours=1)
    if job.state == S.PENDING_APPROVAL:
        job = world.approve(job)
    job = world.wait(job, lambda r: r.state == S.RUNNING, advance=5)
    notebook = world.submit("bob", "notebook", "h100-80gb-offline", gpus=1, duration_hours=2)
    notebook.refresh_from_db()
    assert notebook.priority == "interactive", notebook.priority
    job = world.wait(job, lambda r: r.state in (S.PREEMPTED, S.QUEUED) and "Preempted" in " ".join(
        r.events.values_list("message", flat=True)), advance=2, also=notebook)
    notebook = world.wait(notebook, lambda r: r.state == S.RUNNING, advance=5)
    job.refresh_from_db()
    assert job.state == S.QUEUED
    assert job.pending_reason.startswith("waiting for 8 x")
    services.request_stop(actor=Actor(user=world.cast.bob), request=notebook)
    job = world.wait(job, lambda r: r.state == S.RUNNING, advance=5)
    job = world.wait(job, lambda r: r.state == S.SUCCEEDED, advance=1800)
    assert _states(job) == [S.APPROVED, S.QUEUED, S.RUNNING, S.PREEMPTED, S.QUEUED, S.RUNNING, S.SUCCEEDED]


def test_the_running_line_follows_the_pods_and_the_replicas(world: World) -> None:
    # A distributed job with two workers: the line says both pods once both run (not the first one's count).
    job = world.submit("bob", "training", "h100-80gb-offline", gpus=1, duration_hours=1,
                       parameters={"command": "torchrun train.py", "distributed": True, "workers": 2})
    if job.state == S.PENDING_APPROVAL:
        job = world.approve(job)
    job = world.wait(job, lambda r: r.state == S.RUNNING and "2 pods running" in r.state_reason, advance=5)
    assert job.state_reason == "Admitted; 2 pods running."
    services.request_stop(actor=Actor(user=world.cast.bob), request=job)
    # An inference service scaled from 1 to 2: the page's "N of M replicas ready" follows the Deployment.
    svc = world.approve(world.submit("bob", "inference", "h100-80gb-offline", gpus=1, duration_hours=4, replicas=1))
    svc = world.wait(svc, lambda r: r.state == S.RUNNING, advance=5)
    assert svc.state_reason == "1 of 1 replica ready."
    services.request_scale(actor=Actor(user=world.cast.bob), request=svc, replicas=2)
    svc = world.wait(svc, lambda r: r.state_reason == "2 of 2 replicas ready.", advance=5)
    assert svc.state == S.RUNNING
    services.request_stop(actor=Actor(user=world.cast.bob), request=svc)


def test_a_preempted_requester_is_told_in_plain_words(world: World, mailoutbox, as_user) -> None:
    job = world.submit("carol", "training", "h100-80gb-offline", gpus=8, duration_hours=1)
    if job.state == S.PENDING_APPROVAL:
        job = world.approve(job)
    job = world.wait(job, lambda r: r.state == S.RUNNING, advance=5)
    notebook = world.submit("bob", "notebook", "h100-80gb-offline", gpus=1, duration_hours=2)
    job = world.wait(job, lambda r: any(m.subject.endswith("was preempted") for m in mailoutbox), advance=2,
                     also=notebook)
    notebook.refresh_from_db()
    (mail,) = [m for m in mailoutbox if m.subject.endswith("was preempted")]
    assert mail.to == [world.cast.carol.email]
    assert f"Preempted by request {notebook.name} (notebook of bob in project Vision), at interactive priority" in mail.body
    assert "What happens next" in mail.body and "UID" not in mail.body
    page = as_user("carol").get(f"/requests/{job.pk}/").content.decode()
    timeline = page[page.index('aria-label="Timeline"'):]
    assert f"Preempted by request {notebook.name}" in timeline and "Preempted to accommodate" not in timeline
    services.request_stop(actor=Actor(user=world.cast.bob), request=notebook)
    services.request_cancel(actor=Actor(user=world.cast.carol), request=job)


def test_distributed_training_under_e_is_a_volcano_gang(fresh_sandbox, cast, worker) -> None:
    world = _world(fresh_sandbox, cast, architecture="E")
    req = world.submit("bob", "training", "h100-80gb-offline", gpus=2, duration_hours=1,
                       parameters={"command": "torchrun train.py", "distributed": True, "workers": 3})
    if req.state == S.PENDING_APPROVAL:
        req = world.approve(req)
    req = world.wait(req, lambda r: r.state in (S.QUEUED, S.RUNNING))
    assert world.objects(req) == {"batch.volcano.sh/v1alpha1/Job": 1}
    req = world.wait(req, lambda r: r.state == S.RUNNING, advance=5)
    req = world.wait(req, lambda r: r.state == S.SUCCEEDED, advance=1800)
    assert _states(req)[-3:] == [S.QUEUED, S.RUNNING, S.SUCCEEDED]


# ------------------------------------------------------------------------------------------------ crash
def test_worker_killed_between_apply_and_record(fresh_sandbox, cast, worker, tmp_path) -> None:
    world = _world(fresh_sandbox, cast, architecture="B")
    # Approve without the hook firing: the request is materialized by a separate process we can kill.
    from workloads import hooks

    original = hooks.request_approved
    hooks.request_approved = lambda request_id: None
    try:
        req = world.submit("carol", "training", "h100-80gb-offline", gpus=1, duration_hours=1)
    finally:
        hooks.request_approved = original
    assert req.state == S.APPROVED
    marker = tmp_path / "applied"
    db = connection.settings_dict
    env = dict(os.environ)
    env.update({
        PAUSE_AFTER_APPLY_ENV: str(marker),
        "DATABASE_URL": f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
        if db["ENGINE"].endswith("postgresql") else f"sqlite:///{db['NAME']}",
        "PYTHONPATH": str(ROOT),
    })
    code = f"from workloads.materialize import request_materialize; request_materialize(request_id={req.pk})"
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "shell", "-c", code], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "the materializer exited before applying"
            assert time.monotonic() < deadline, "the materializer never applied"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)  # after the apply, before the state is saved
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    req.refresh_from_db()
    assert req.state == S.APPROVED
    assert world.objects(req) == {"batch/v1/Job": 1}
    job_uid = fresh_sandbox.store.get("batch/v1", "Job", req.k8s_name, req.project.namespace)["metadata"]["uid"]
    # The retry (what the housekeeping sweep queues): the same objects again, then the state.
    request_materialize_task.delay(req.pk)
    req = world.wait(req, lambda r: r.state in (S.QUEUED, S.RUNNING), timeout=30)
    assert world.objects(req) == {"batch/v1/Job": 1}
    assert fresh_sandbox.store.get("batch/v1", "Job", req.k8s_name, req.project.namespace)["metadata"]["uid"] == job_uid
    assert req.attempts == 2
    assert request_materialize(request_id=req.pk) == "skipped"  # and a third run does nothing


# ------------------------------------------------------------------------------------------------ concurrency
def test_fifty_concurrent_submissions_agree_with_the_cluster(fresh_sandbox, cast, worker) -> None:
    world = _world(fresh_sandbox, cast, architecture="B", gpus=8)
    users = [cast.carol, cast.bob]

    def submit(i: int) -> int:
        try:
            req = services.request_submit(
                actor=Actor(user=users[i % 2]), project=cast.vision, template=world.templates["training"], image=IMAGE,
                flavor=world.flavors["h100-80gb-offline"], gpus=1, duration_hours=2,
                parameters={"command": f"python train.py --seed {i}"}, idempotency_key=f"k-{i}",
            )
            return req.pk
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=10) as pool:
        ids = list(pool.map(submit, range(50)))
    assert len(set(ids)) == 50
    reqs = WorkloadRequest.objects.filter(pk__in=ids)
    deadline = time.monotonic() + 120
    while reqs.filter(state=S.APPROVED).exists():
        assert time.monotonic() < deadline, "not every request was materialized"
        time.sleep(0.5)
    for _ in range(4):
        fresh_sandbox.advance(5)
        world.sync()
    running = set(reqs.filter(state=S.RUNNING).values_list("pk", flat=True))
    store = fresh_sandbox.store
    admitted = set()
    for wl in store.list("kueue.x-k8s.io/v1beta2", "Workload", cast.vision.namespace)["items"]:
        admitted_now = any(c["type"] == "Admitted" and c["status"] == "True" for c in (wl.get("status") or {}).get("conditions") or [])
        owner = (wl["metadata"].get("ownerReferences") or [{}])[0].get("name", "")
        if admitted_now and owner.startswith("req-"):
            admitted.add(int(owner.split("-")[1]))
    assert admitted == running
    assert len(running) == 8  # exactly the project's nominal quota: nothing beyond it
    assert reqs.filter(state=S.QUEUED).count() == 42
    assert len(store.list("batch/v1", "Job", cast.vision.namespace)["items"]) == 50
    cq = store.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", cast.vision.slug)
    used = {r["name"]: r["total"] for f in cq["status"]["flavorsUsage"] for r in f["resources"] if f["name"] == "h100-80gb-offline"}
    assert str(used["nvidia.com/gpu"]) == "8"


# ------------------------------------------------------------------------------------------------ demo
def test_demo_requests_reach_their_states(world: World) -> None:
    from workloads.demo import seed_request_demo

    made = {r.name: r for r in seed_request_demo()}
    assert set(made) == {"resnet-baseline", "explore-data", "llm-finetune", "hparam-sweep", "chat-demo"}
    assert made["hparam-sweep"].state == S.PENDING_APPROVAL
    assert made["chat-demo"].state == S.APPROVED and made["chat-demo"].approved_by is not None  # the project admin
    world.wait(made["resnet-baseline"], lambda r: r.state == S.RUNNING, advance=5)
    world.wait(made["explore-data"], lambda r: r.state == S.RUNNING, advance=5)
    pending = world.wait(made["llm-finetune"], lambda r: r.state == S.QUEUED and r.pending_reason.startswith("waiting for"))
    assert "asks for" in pending.pending_reason and "the project has" in pending.pending_reason
    assert len(seed_request_demo()) == 5 and WorkloadRequest.objects.count() == 5  # idempotent
