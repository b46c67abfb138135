"""Benchmark of the request lifecycle (a script, not a test): submission through the API, and status following.

    python tests/bench/requests_bench.py [--submit 1000] [--active 1000,5000] [--changes 0,10,100]

It makes a throwaway test database (PostgreSQL when DATABASE_URL points at one) and starts sandbox clusters in
this process; nothing of a running portal is touched.

1. Submission: N POSTs to ``/api/v1/requests/`` with a project token (``Idempotency-Key`` each); prints p50/p95
   latency, submissions per second accepted by the API and database queries per request (first and last hundred:
   constant, not growing with N). The approved requests are materialized meanwhile by a real Celery worker
   (``--workers celery``, the default: ``celery -A portal worker -c CONCURRENCY`` in a child process on this
   database and broker, on a queue of its own; stopped at the end) or by threads calling the materializer
   (``--workers threads``); prints end-to-end requests per second until all are ``queued`` in the sandbox, and
   where the time goes (API time per submission, submission-to-queued wait, claims per request).
2. Status following: with A active requests whose Jobs exist in a sandbox (controllers off: only our changes
   happen), one resync, then follower cycles in which C requests change (a pod of theirs starts running);
   prints cluster calls, database queries and writes per cycle for each (A, C): they follow C, not A.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("PORTAL_VAR_DIR", str(REPO / "var" / "bench"))

import django

django.setup()

from decimal import Decimal

from django.conf import settings
from django.db import connection, connections
from django.db.models import Count
from django.test.utils import setup_test_environment


class QueryCounter:
    """Counts this connection's queries (and writes) through ``connection.execute_wrapper``; no log size limit."""

    def __init__(self) -> None:
        self.count = 0
        self.writes = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        if sql.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE")):
            self.writes += 1
        return execute(sql, params, many, context)


class RemoteSandbox:
    """The sandbox cluster in a child process (``python -m sandbox``), so its controllers don't share our GIL."""

    controllers = True

    def __init__(self, kubeconfig: Path) -> None:
        import subprocess

        self.kubeconfig = kubeconfig
        self.proc = subprocess.Popen([sys.executable, "-m", "sandbox", "--kubeconfig", str(kubeconfig)], cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not kubeconfig.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the sandbox did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def make_world(sandbox, *, gpus: int, architecture: str = "B"):
    from portal.kube import kube_for
    from quotas.inventory import flavors_discover, inventory_sync, node_taints
    from quotas.models import Cluster, Flavor, Quota
    from quotas.reconcile import reconcile
    from tenants.models import Role
    from tests.factories import UserFactory, make_member, make_project, make_tenant
    from workloads.catalogue import seed_catalogue
    from workloads.models import ServiceTemplate

    suffix = str(time.monotonic_ns())[-6:]
    tenant = make_tenant(f"bench-{suffix}")
    project = make_project(tenant, f"bench-{suffix}-p")
    admin = UserFactory(username=f"bench-admin-{suffix}")
    make_member(admin, tenant, Role.PROJECT_ADMIN, project)
    cluster = Cluster.objects.create(name=f"bench-{suffix}", architecture=architecture, kubeconfig_path=str(sandbox.kubeconfig))
    kube = kube_for(cluster)
    if sandbox.controllers is not None:
        inventory_sync(cluster, kube=kube)
        for flavor in flavors_discover(cluster, taints_by_node=node_taints(kube)):
            flavor.save()
    else:
        Flavor.objects.create(cluster=cluster, name="h100", display_name="H100", kind="whole",
                              node_labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    for flavor in Flavor.objects.filter(cluster=cluster):
        for resource in flavor.resource_names:
            amount = {"cpu": 100000, "memory": 1000000}.get(resource, gpus)
            if resource.startswith("nvidia.com/total-gpu"):
                amount = 100 * gpus if "cores" in resource else 46068 * gpus
            Quota.objects.create(tenant=tenant, flavor=flavor, resource=resource, nominal=Decimal(amount))
            Quota.objects.create(tenant=tenant, project=project, flavor=flavor, resource=resource, nominal=Decimal(amount),
                                 borrowing_limit=Decimal(0))
    seed_catalogue()
    for template in ServiceTemplate.objects.all():
        template.allowed_flavors.set(Flavor.objects.filter(cluster=cluster))
    if sandbox.controllers is not None:
        reconcile(cluster, kube=kube)
    return cluster, tenant, project, admin


# ------------------------------------------------------------------------------------------------ 1. submission
class CeleryWorker:
    """A real Celery worker (``celery -A portal worker``) in a child process on this database and broker, consuming
    a queue of its own (so no other worker takes our tasks, and it takes none of theirs)."""

    def __init__(self, queue_name: str, concurrency: int) -> None:
        import subprocess

        from portal.celery import app

        db = connection.settings_dict
        env = dict(os.environ)
        if db["ENGINE"].endswith("postgresql"):
            env["DATABASE_URL"] = (f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db.get('HOST') or '127.0.0.1'}:"
                                   f"{db.get('PORT') or 5432}/{db['NAME']}")
        else:
            env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
        env["PYTHONPATH"] = str(REPO)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "-Q", queue_name, "-c", str(concurrency),
             "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle", "--without-gossip"],
            cwd=REPO, env=env, start_new_session=True)
        app.conf.task_routes = {"workloads.tasks.*": {"queue": queue_name}}
        app.amqp.flush_routes()
        app.amqp.__dict__.pop("router", None)

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def bench_submit(n: int, tmp: Path, *, workers: str, concurrency: int) -> None:
    from rest_framework.test import APIClient

    from tenants.access import Actor
    from tenants.services import token_create
    from workloads import hooks
    from workloads.materialize import requests_materialize
    from workloads.models import RequestState, WorkloadRequest

    sandbox = RemoteSandbox(tmp / "submit.kubeconfig")
    worker = None
    hooks_before = hooks.request_approved
    threads: list[threading.Thread] = []
    approved: queue.Queue[int | None] = queue.Queue()
    try:
        cluster, _, project, admin = make_world(sandbox, gpus=4 * n)
        token, raw = token_create(actor=Actor(user=admin), project=project, name="ci", scope="read+submit")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

        if workers == "celery":
            # The on-commit hook queues the real task; a real worker (child process) runs it.
            worker = CeleryWorker(f"bench-requests-{os.getpid()}", concurrency)
        else:
            hooks.request_approved = approved.put  # threads stand in for the workers

            def materializer() -> None:
                while (rid := approved.get()) is not None:
                    requests_materialize(request_id=rid)
                connections.close_all()

            threads = [threading.Thread(target=materializer, daemon=True) for _ in range(concurrency)]
            for t in threads:
                t.start()
        latencies: list[float] = []
        queries: list[int] = []
        start = time.perf_counter()
        for i in range(n):
            body = {"template": "training", "flavor": "h100-80gb-offline", "gpus": 1, "duration_hours": 1,
                    "parameters": {"command": f"python train.py --seed {i}"}, "image": "nvcr.io/nvidia/pytorch:26.10-py3",
                    "name": f"bench-{i}"}  # a made-up name is 6 random hex digits: 1,000 of them may collide
            counter = QueryCounter()
            with connection.execute_wrapper(counter):
                t0 = time.perf_counter()
                response = client.post("/api/v1/requests/", body, format="json", HTTP_IDEMPOTENCY_KEY=f"bench-{i}")
                latencies.append(time.perf_counter() - t0)
            assert response.status_code == 201, (response.status_code, response.content[:500])
            queries.append(counter.count)
        submitted = time.perf_counter()
        mine = WorkloadRequest.objects.filter(cluster=cluster)
        deadline = time.monotonic() + 600
        while mine.filter(state=RequestState.APPROVED).exists():
            assert time.monotonic() < deadline, "requests still approved after 10 minutes"
            time.sleep(0.1)
        drained = time.perf_counter()
        for _ in threads:
            approved.put(None)
        for t in threads:
            t.join()
        states = dict(mine.values_list("state").annotate(n=Count("pk")))
        from portal.kube import kube_for

        jobs = len(kube_for(cluster).list("batch/v1", "Job", project.namespace)[0])
        waits = sorted((q - c).total_seconds() for c, q in mine.values_list("created_at", "queued_at") if q)
        attempts = dict(mine.values_list("attempts").annotate(n=Count("pk")))
        api_s, e2e_s = submitted - start, drained - start
        print(f"\n1. submit {n} requests through the API with a project token; materialized by "
              f"{'a Celery worker (' + str(concurrency) + ' processes)' if worker else str(concurrency) + ' threads'}")
        print(f"   latency p50 {pct(latencies, 50) * 1000:.1f} ms, p95 {pct(latencies, 95) * 1000:.1f} ms; "
              f"accepted by the API {n / api_s:.0f}/s ({api_s:.1f} s)")
        print(f"   DB queries per request: first 100 avg {statistics.mean(queries[:100]):.1f}, "
              f"last 100 avg {statistics.mean(queries[-100:]):.1f}, min {min(queries)}, max {max(queries)}")
        print(f"   end to end: all {n} queued in the sandbox {e2e_s:.1f} s after the first POST = {n / e2e_s:.0f}/s "
              f"({drained - submitted:.1f} s after the last POST)")
        print(f"   where the time goes: API {api_s / n * 1000:.1f} ms per submission (one client, in process); "
              f"submission to queued p50 {pct(waits, 50):.2f} s, p95 {pct(waits, 95):.2f} s, max {waits[-1]:.2f} s; "
              f"claims per request {attempts}")
        print(f"   states: {states}; Jobs in the cluster: {jobs}")
        assert states.get(RequestState.QUEUED, 0) + states.get(RequestState.RUNNING, 0) == n
        assert jobs == n
    finally:
        hooks.request_approved = hooks_before
        if worker is not None:
            worker.stop()
        sandbox.stop()


# ------------------------------------------------------------------------------------------------ 2. following
def bench_follow(active_counts: list[int], change_counts: list[int], tmp: Path) -> None:
    from portal.kube import kube_cache_clear
    from sandbox.app import Sandbox
    from workloads.manifests import request_manifests
    from workloads.models import RequestState, ServiceTemplate, WorkloadRequest
    from workloads.status import StatusFollower

    print("\n2. status following (controllers off: only the changes below happen)")
    print("   active  changes  cluster calls  DB queries  DB writes  moves   cycle s")
    for active in active_counts:
        kube_cache_clear()
        sandbox = Sandbox(kubeconfig=tmp / f"follow-{active}.kubeconfig", controllers=False).start()
        try:
            cluster, tenant, project, admin = make_world(sandbox, gpus=10 * active)
            store = sandbox.store
            store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": project.namespace}})
            from quotas.models import Flavor

            flavor = Flavor.objects.get(cluster=cluster, name="h100")
            template = ServiceTemplate.objects.get(slug="training", version=1)
            rows = [WorkloadRequest(tenant=tenant, project=project, cluster=cluster, template=template, name=f"r{i}",
                                    image="img:1", flavor=flavor, gpus=1, duration_hours=1, state=RequestState.QUEUED,
                                    requested_by=admin, parameters={"command": "x"})
                    for i in range(active)]
            rows = WorkloadRequest.objects.bulk_create(rows, batch_size=1000)
            for req in rows:
                req.tenant, req.project, req.cluster, req.template, req.flavor = tenant, project, cluster, template, flavor
                for obj in request_manifests(req):
                    store.create(obj)
            follower = StatusFollower(cluster, watch_seconds=1)
            counter = QueryCounter()
            with connection.execute_wrapper(counter):
                stats = follower.cycle(resync=True)
            print(f"   {active:6d}  resync   {stats.cluster_calls:13d}  {counter.count:10d}  {counter.writes:9d}  "
                  f"{stats.moves:5d}  (first sight of every request)")
            offset = 0
            for changes in change_counts:
                for req in rows[offset:offset + changes]:
                    pod = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": f"{req.k8s_name}-x", "namespace": project.namespace,
                                        "labels": {"gpuportal.dev/request": str(req.pk)}},
                           "spec": {"containers": [{"name": "main", "image": "img:1"}], "nodeName": "n"}}
                    created = store.create(pod)
                    created["status"] = {"phase": "Running"}
                    store.update(created, subresource="status")
                offset += changes
                t0 = time.perf_counter()
                counter = QueryCounter()
                with connection.execute_wrapper(counter):
                    stats = follower.cycle(resync=False)
                took = time.perf_counter() - t0
                print(f"   {active:6d}  {changes:7d}  {stats.cluster_calls:13d}  {counter.count:10d}  "
                      f"{counter.writes:9d}  {stats.moves:5d}  {took:7.2f}")
        finally:
            sandbox.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submit", type=int, default=1000)
    parser.add_argument("--workers", choices=["celery", "threads"], default="celery",
                        help="a real Celery worker (child process; needs REDIS_URL) or threads in this process")
    parser.add_argument("--concurrency", type=int, default=4, help="worker processes (or threads)")
    parser.add_argument("--active", default="1000,5000")
    parser.add_argument("--changes", default="0,10,100")
    args = parser.parse_args()
    setup_test_environment()
    settings.DEBUG = False
    settings.API_RATE_USER = settings.API_RATE_SUBMIT = ""  # one token submits N requests: no rate limit here
    db = connection.settings_dict
    db.setdefault("TEST", {})["NAME"] = f"test_bench_requests_{os.getpid()}"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    print(f"database {db['ENGINE'].rsplit('.', 1)[-1]} ({db['NAME']})")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.submit:
                bench_submit(args.submit, Path(tmp), workers=args.workers, concurrency=args.concurrency)
            bench_follow([int(x) for x in args.active.split(",") if x], [int(x) for x in args.changes.split(",") if x], Path(tmp))
    finally:
        connections.close_all()
        connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
