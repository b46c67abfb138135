"""Benchmark of the request lifecycle (a script, not a test): submission through the API, and status following.

    python tests/bench/requests_bench.py [--submit 1000] [--active 1000,5000] [--changes 0,10,100] [--cluster real]
                                         [--follow-real 5000 --samples 20]

``--cluster real``: the submissions go to the real control plane (kube-apiserver, Kueue; make cluster-build first)
and Kueue's own admission rate is printed next to the portal's materialisation rate.

It makes a throwaway test database (PostgreSQL when DATABASE_URL points at one) and starts sandbox clusters in
this process; nothing of a running portal is touched.

1. Submission: N POSTs to ``/api/v1/requests/`` with a project token (``Idempotency-Key`` each); prints p50/p95
   latency, submissions per second accepted by the API and database queries per request (first and last hundred:
   constant, not growing with N). The approved requests are materialized meanwhile by a real Celery worker
   (``--workers celery``, the default: ``celery -A portal worker -c CONCURRENCY`` in a child process on this
   database and broker, on a queue of its own; stopped at the end) or by threads calling the materializer
   (``--workers threads``); prints end-to-end requests per second until all are ``queued`` in the sandbox, and
   where the time goes (API time per submission, submission-to-queued wait, claims per request).
   ``--http-clients N``: over HTTP against gunicorn instead, with the CPU seconds of each part (gunicorn, the Celery
   worker, the sandbox, this process and its client threads, the database's backends) per request;
   ``--stages`` times the API and the worker one after the other, ``--still-cluster`` keeps the sandbox's
   controllers from running (only its API server answers).
2. Status following: with A active requests whose Jobs exist in a sandbox (controllers off: only our changes
   happen), one resync, then follower cycles in which C requests change (a pod of theirs starts running);
   prints cluster calls, database queries and writes per cycle for each (A, C): they follow C, not A.
"""

from __future__ import annotations

import argparse
import contextlib
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
    """The sandbox cluster in a child process (``python -m sandbox``), so its controllers don't share our GIL.
    ``still``: its controllers never run (``--tick-interval 0``): Jobs are stored and nothing admits or runs them."""

    controllers = True

    def __init__(self, kubeconfig: Path, *, still: bool = False) -> None:
        import subprocess

        self.kubeconfig = kubeconfig
        self.proc = subprocess.Popen([sys.executable, "-m", "sandbox", "--kubeconfig", str(kubeconfig),
                                      *(["--tick-interval", "0"] if still else [])], cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not kubeconfig.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the sandbox did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class RemoteReal:
    """The real control plane (``python -m realcluster``: kube-apiserver, Kueue, kwok nodes) in a child process."""

    controllers = True
    kind = "real"

    def __init__(self, kubeconfig: Path) -> None:
        import subprocess

        self.kubeconfig = kubeconfig
        self.proc = subprocess.Popen([sys.executable, "-m", "realcluster", "--kubeconfig", str(kubeconfig),
                                      "--state-dir", str(kubeconfig.parent / "realcluster")], cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while not kubeconfig.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the real control plane did not start (make cluster-build first)")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def kueue_admissions(cluster, namespace: str, n: int, start_wall: float, timeout: float = 600) -> None:
    """Wait for ``n`` Workloads Admitted by Kueue in ``namespace``; print Kueue's admission rate from the
    conditions' own times (seconds resolution)."""
    from datetime import datetime

    from portal.kube import kube_for

    kube = kube_for(cluster)
    deadline = time.monotonic() + timeout
    while True:
        items = kube.list("kueue.x-k8s.io/v1beta2", "Workload", namespace)[0]
        admitted = []
        for wl in items:
            for c in (wl.get("status") or {}).get("conditions") or []:
                if c.get("type") == "Admitted" and c.get("status") == "True":
                    admitted.append(datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00")).timestamp())
        if len(admitted) >= n or time.monotonic() > deadline:
            break
        time.sleep(1)
    admitted.sort()
    if not admitted:
        print("   Kueue admitted nothing")
        return
    span = max(1.0, admitted[-1] - admitted[0])
    print(f"   Kueue: {len(admitted)} of {n} Workloads Admitted; the last {admitted[-1] - start_wall:.1f} s after the "
          f"first POST; admission rate {len(admitted) / span:.0f}/s over {span:.0f} s (first to last Admitted)")


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


# ------------------------------------------------------------------------------------------------ CPU per component
def _process_table() -> dict[int, tuple[int, float]]:
    """Every process of this machine: pid -> (parent pid, CPU seconds so far, user + system), from ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return table


def cpu_snapshot(roots: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    """CPU seconds used so far by each process of each component: its root processes and their descendants, less
    the trees of the other components (this process is the parent of the others). Linux only."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, dict[int, float]] = {}
    for name, pids in roots.items():
        others = {pid for other, its in roots.items() if other != name for pid in its}
        seen: set[int] = set()
        todo = list(pids)
        while todo:
            pid = todo.pop()
            if pid in seen or pid not in table or pid in others:  # another component's tree is not ours
                continue
            seen.add(pid)
            todo.extend(children.get(pid, []))
        out[name] = {pid: table[pid][1] for pid in seen}
    return out


def cpu_used(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, float]:
    """CPU seconds each component used between two snapshots (a process started meanwhile counts from zero)."""
    return {name: sum(secs - before.get(name, {}).get(pid, 0.0) for pid, secs in pids.items())
            for name, pids in after.items()}


def database_backends() -> list[int]:
    """The PostgreSQL backends connected to the benchmark's database (none on SQLite)."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        return [row[0] for row in cursor.fetchall()]


# ------------------------------------------------------------------------------------------------ 1. submission
class CeleryWorker:
    """A real Celery worker (``celery -A portal worker``) in a child process on this database and broker, consuming
    a queue of its own (so no other worker takes our tasks, and it takes none of theirs)."""

    def __init__(self, queue_name: str | None, concurrency: int, env_extra: dict[str, str] | None = None) -> None:
        import subprocess

        from portal.celery import app

        env = database_env() | (env_extra or {})
        queue_args = ["-Q", queue_name] if queue_name else []  # None: the default queue (under the env's key prefix)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", *queue_args, "-c", str(concurrency),
             "--loglevel", "WARNING", "--without-heartbeat", "--without-mingle", "--without-gossip"],
            cwd=REPO, env=env, start_new_session=True)
        if queue_name:
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


def database_env() -> dict[str, str]:
    """This process's environment with DATABASE_URL naming the benchmark's database (for child processes)."""
    db = connection.settings_dict
    env = dict(os.environ)
    if db["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = (f"postgres://{db['USER']}:{db.get('PASSWORD') or ''}@{db.get('HOST') or '127.0.0.1'}:"
                               f"{db.get('PORT') or 5432}/{db['NAME']}")
    else:
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    env["PYTHONPATH"] = str(REPO)
    return env


def bench_submit(n: int, tmp: Path, *, workers: str, concurrency: int, real: bool = False) -> None:
    from rest_framework.test import APIClient

    from tenants.access import Actor
    from tenants.services import token_create
    from workloads import hooks
    from workloads.materialize import requests_materialize
    from workloads.models import RequestState, WorkloadRequest

    sandbox = RemoteReal(tmp / "submit.kubeconfig") if real else RemoteSandbox(tmp / "submit.kubeconfig")
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
        start_wall = time.time()
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
        print(f"   end to end: all {n} queued in the {getattr(sandbox, 'kind', 'sandbox')} cluster {e2e_s:.1f} s after the first POST = {n / e2e_s:.0f}/s "
              f"({drained - submitted:.1f} s after the last POST)")
        print(f"   where the time goes: API {api_s / n * 1000:.1f} ms per submission (one client, in process); "
              f"submission to queued p50 {pct(waits, 50):.2f} s, p95 {pct(waits, 95):.2f} s, max {waits[-1]:.2f} s; "
              f"claims per request {attempts}")
        print(f"   states: {states}; Jobs in the cluster: {jobs}")
        assert states.get(RequestState.QUEUED, 0) + states.get(RequestState.RUNNING, 0) == n
        assert jobs == n
        if real:
            kueue_admissions(cluster, project.namespace, n, start_wall)
    finally:
        hooks.request_approved = hooks_before
        if worker is not None:
            worker.stop()
        sandbox.stop()


# ------------------------------------------------------------------------------------------------ 1b. over HTTP
class Gunicorn:
    """gunicorn (sync workers, DEBUG off) serving the benchmark's database in a child process."""

    def __init__(self, workers: int, env: dict[str, str]) -> None:
        import socket
        import subprocess

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "portal.wsgi:application", "--workers", str(workers), "--worker-class",
             "sync", "--bind", f"127.0.0.1:{self.port}", "--log-level", "warning", "--timeout", "120"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 90
        while True:
            try:
                if self.call("GET", "/accounts/login/", {}, None)[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("gunicorn did not start")
            time.sleep(0.2)

    def call(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> tuple[int, bytes]:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def submission_body(i: int) -> dict:
    return {"template": "training", "flavor": "h100-80gb-offline", "gpus": 1, "duration_hours": 1,
            "parameters": {"command": f"python train.py --seed {i}"}, "image": "nvcr.io/nvidia/pytorch:26.10-py3",
            "name": f"bench-{i}"}  # a made-up name is 6 random hex digits: 1,000 of them may collide


def bench_submit_http(n: int, tmp: Path, *, clients: int, servers: int, concurrency: int, stages: bool = False,
                      still_cluster: bool = False) -> None:
    """N submissions from ``clients`` concurrent HTTP clients against gunicorn with ``servers`` sync workers, a real
    Celery worker with ``concurrency`` processes and the sandbox in a child process: from the first POST until every
    request is queued in the cluster. Checks that nothing was lost or done twice.

    ``stages``: one stage after the other, each alone on the machine: the API takes every submission with no worker
    running, then the worker starts and materializes the backlog; each stage's own throughput and CPU.
    ``still_cluster``: the sandbox's controllers never run, so the simulated cluster's own work (admission, pods,
    their scheduling and status) takes none of the machine's CPU; only its API server answers the portal."""
    import itertools
    import json

    from django.db.models import Max, Min

    from tenants.access import Actor
    from tenants.services import token_create
    from workloads.models import RequestEvent, RequestState, WorkloadRequest

    sandbox = RemoteSandbox(tmp / "submit-http.kubeconfig", still=still_cluster)
    prefix = f"bench-requests-{os.getpid()}:"
    env = database_env() | {
        "DJANGO_SETTINGS_MODULE": "tests.bench.speed_settings", "SPEED_BROKER_PREFIX": prefix,  # a private broker
        "DEBUG": "0", "API_RATE_USER": "", "API_RATE_SUBMIT": "", "DB_CONN_MAX_AGE": "60",
    }
    server = worker = None
    try:
        cluster, _, project, admin = make_world(sandbox, gpus=4 * n)
        _, raw = token_create(actor=Actor(user=admin), project=project, name="ci", scope="read+submit")
        headers = {"Authorization": f"Bearer {raw}", "Content-Type": "application/json", "Accept": "application/json"}
        if not stages:
            worker = CeleryWorker(None, concurrency, env)
        server = Gunicorn(servers, env)
        # Warm every gunicorn worker (imports, first connection) with a GET; no submission before the clock starts.
        for _ in range(servers * 3):
            server.call("GET", "/api/v1/requests/?page_size=1", headers, None)

        counter = itertools.count()
        latencies: list[float] = []
        failures: list[tuple[int, bytes]] = []
        lock = threading.Lock()
        barrier = threading.Barrier(clients + 1)

        def client() -> None:
            barrier.wait()
            while (i := next(counter)) < n:
                body = json.dumps(submission_body(i)).encode()
                t0 = time.perf_counter()
                try:
                    status, content = server.call("POST", "/api/v1/requests/", headers | {"Idempotency-Key": f"bench-{i}"},
                                                  body)
                except OSError as exc:  # a broken connection: retried with the same key (idempotent)
                    status, content = 0, str(exc).encode()
                    with contextlib.suppress(OSError):
                        status, content = server.call(
                            "POST", "/api/v1/requests/", headers | {"Idempotency-Key": f"bench-{i}"}, body)
                took = time.perf_counter() - t0
                with lock:
                    if status in (200, 201):
                        latencies.append(took)
                    else:
                        failures.append((status, content[:300]))

        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()

        def components() -> dict[str, list[int]]:
            return {"gunicorn": [server.proc.pid], "Celery worker": [worker.proc.pid] if worker else [],
                    "sandbox": [sandbox.proc.pid], "clients and bench": [os.getpid()], "PostgreSQL": database_backends()}

        cpu_before = cpu_snapshot(components())
        load_before = os.getloadavg()[0]
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        submitted = time.perf_counter()
        mine = WorkloadRequest.objects.filter(cluster=cluster)
        worker_started = submitted
        if stages:
            api_cpu = cpu_used(cpu_before, cpu_snapshot(components()))
            worker = CeleryWorker(None, concurrency, env)
            worker_started = time.perf_counter()
            cpu_before = cpu_snapshot(components())
        deadline = time.monotonic() + 600
        while mine.filter(state__in=[RequestState.APPROVED, RequestState.SUBMITTED]).exists():
            assert time.monotonic() < deadline, "requests still approved after 10 minutes"
            time.sleep(0.05)
        drained = time.perf_counter()
        cpu = cpu_used(cpu_before, cpu_snapshot(components()))

        from portal.kube import kube_for

        jobs = kube_for(cluster).list("batch/v1", "Job", project.namespace)[0]
        job_names = [j["metadata"]["name"] for j in jobs]
        states = dict(mine.values_list("state").annotate(n=Count("pk")))
        names = mine.values("name").distinct().count()
        queued_events = RequestEvent.objects.filter(request__cluster=cluster, to_state=RequestState.QUEUED)
        from collections import Counter

        per_request = Counter(queued_events.values_list("request_id", flat=True))
        moves_per_request = dict(Counter(per_request.values()))
        batches = mine.exclude(queued_at=None).values("queued_at").distinct().count()
        waits = sorted((q - c).total_seconds() for c, q in mine.values_list("created_at", "queued_at") if q)
        attempts = dict(mine.values_list("attempts").annotate(n=Count("pk")))
        span = mine.aggregate(first=Min("created_at"), last=Max("created_at"))
        api_s, e2e_s = submitted - start, drained - start
        queued_span = mine.aggregate(first=Min("queued_at"), last=Max("queued_at"))
        print(f"\n1b. submit {n} requests over HTTP: {clients} concurrent clients, gunicorn with {servers} sync workers, "
              f"a Celery worker with {concurrency} processes, the sandbox in a child process"
              f"{' (still: no controller runs)' if still_cluster else ''} (load average {load_before:.1f} before, "
              f"{os.getloadavg()[0]:.1f} after; {os.cpu_count()} CPUs shared by all of them and whatever else runs)")
        print(f"   latency p50 {pct(latencies, 50) * 1000:.1f} ms, p95 {pct(latencies, 95) * 1000:.1f} ms; "
              f"accepted by the API {n / api_s:.0f}/s ({api_s:.1f} s); failed calls {len(failures)}")
        print(f"   end to end: all {n} queued in the {getattr(sandbox, 'kind', 'sandbox')} cluster {e2e_s:.1f} s after the first POST = {n / e2e_s:.0f}/s "
              f"({drained - submitted:.1f} s after the last POST)")
        cores = os.cpu_count() or 1
        if stages:
            materialize_s = (queued_span["last"] - queued_span["first"]).total_seconds()
            print(f"   stage by stage: the API alone accepted {n / api_s:.0f}/s; then the worker, started "
                  f"{worker_started - submitted:.1f} s after the last POST, queued them all {drained - worker_started:.1f} s "
                  f"after its start, {materialize_s:.1f} s from the first queued to the last = "
                  f"{n / max(materialize_s, 0.001):.0f}/s")
            print("   CPU seconds of the API stage: " + ", ".join(
                f"{name} {secs:.1f} s ({secs / n * 1000:.1f} ms per request)" for name, secs in api_cpu.items() if secs))
            print(f"   CPU seconds of the worker stage (from the worker's start; {drained - worker_started:.1f} s x {cores} CPUs): "
                  + ", ".join(f"{name} {secs:.1f} s ({secs / n * 1000:.1f} ms per request)" for name, secs in cpu.items()
                              if secs))
        print(f"   submission to queued p50 {pct(waits, 50):.2f} s, p95 {pct(waits, 95):.2f} s, max {waits[-1]:.2f} s; "
              f"recorded queued in {batches} writes ({n / max(batches, 1):.1f} requests per batch); claims per "
              f"request {attempts}; 'queued' timeline entries per request {moves_per_request}")
        print(f"   states: {states}; distinct names {names}; Jobs in the cluster {len(jobs)} "
              f"({len(set(job_names))} distinct); first to last row {(span['last'] - span['first']).total_seconds():.1f} s")
        if not stages:
            print(f"   CPU seconds from the first POST to all queued ({e2e_s:.1f} s x {cores} CPUs = {e2e_s * cores:.1f} s "
                  f"available, shared with whatever else runs): "
                  + ", ".join(f"{name} {secs:.1f} s ({secs / n * 1000:.1f} ms per request)" for name, secs in cpu.items())
                  + f"; total {sum(cpu.values()):.1f} s")
        for status, content in failures[:5]:
            print(f"   failed: {status} {content!r}")
        assert not failures, f"{len(failures)} submissions failed"
        assert mine.count() == n and names == n, "lost or duplicated requests"
        assert states.get(RequestState.QUEUED, 0) + states.get(RequestState.RUNNING, 0) == n
        assert len(jobs) == n and len(set(job_names)) == n, "lost or duplicated Jobs"
        assert moves_per_request == {1: n}, "a request recorded queued more than once"
    finally:
        if server is not None:
            server.stop()
        if worker is not None:
            worker.stop()
        sandbox.stop()
        try:
            import redis

            r = redis.Redis.from_url(os.environ["REDIS_URL"])
            keys = list(r.scan_iter(f"{prefix}*"))
            if keys:
                r.delete(*keys)
        except Exception:
            pass


# ------------------------------------------------------------------------------------------------ 2. following
def bench_follow(active_counts: list[int], change_counts: list[int], tmp: Path) -> None:
    from portal.kube import kube_cache_clear
    from sandbox.app import Sandbox
    from workloads.kinds import request_manifests
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


def bench_follow_real(active: int, samples: int, tmp: Path) -> None:
    """The status follower's lag on the real control plane with ``active`` live Workloads: ``active`` training
    requests whose Jobs wait in Kueue (the project's GPU quota is 0); then, ``samples`` times, one more GPU of quota,
    so Kueue admits the head of the queue. Lag = from Kueue's Admitted reaching a watch on the API server to the
    request's ``admitted_at`` in the database (what every page reads), each observed every 20 ms."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    from portal.kube import kube_cache_clear, kube_for
    from quotas.models import Flavor, Quota
    from quotas.reconcile import reconcile
    from workloads.kinds import request_manifests
    from workloads.models import RequestState, ServiceTemplate, WorkloadRequest
    from workloads.status import StatusFollower

    print(f"\n2r. status following on the real control plane: {active} live Workloads, {samples} admissions")
    kube_cache_clear()
    real = RemoteReal(tmp / "follow-real.kubeconfig")
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        cluster, tenant, project, admin = make_world(real, gpus=0)
        kube = kube_for(cluster)
        flavor = Flavor.objects.get(cluster=cluster, name="h100-80gb-offline")
        template = ServiceTemplate.objects.get(slug="training", version=1)
        rows = WorkloadRequest.objects.bulk_create(
            [WorkloadRequest(tenant=tenant, project=project, cluster=cluster, template=template, name=f"r{i}",
                             image="img:1", flavor=flavor, gpus=1, duration_hours=1, state=RequestState.QUEUED,
                             requested_by=admin, parameters={"command": "x"}) for i in range(active)], batch_size=1000)
        for req in rows:
            req.tenant, req.project, req.cluster, req.template, req.flavor = tenant, project, cluster, template, flavor
        by_job = {req.k8s_name: req.pk for req in rows}
        t0 = time.perf_counter()

        def create(req: WorkloadRequest) -> None:
            for obj in request_manifests(req):
                kube.apply(obj)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, rows))
        print(f"   {active} Jobs written in {time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        while True:
            items, version = kube.list("kueue.x-k8s.io/v1beta2", "Workload", project.namespace)
            if len(items) >= active or time.perf_counter() - t0 > 900:
                break
            time.sleep(2)
        print(f"   Kueue made {len(items)} Workloads (pending: no quota) {time.perf_counter() - t0:.0f} s later")
        follower = StatusFollower(cluster, watch_seconds=1)
        t0 = time.perf_counter()
        follower.cycle(resync=True)
        print(f"   the follower's first full cycle over {active} requests: {time.perf_counter() - t0:.1f} s")
        connections.close_all()

        seen_cluster: dict[int, float] = {}
        seen_portal: dict[int, float] = {}

        def follow() -> None:
            while not stop.is_set():
                follower.cycle(resync=False)
            connections.close_all()

        def watch_cluster() -> None:
            rv = version
            while not stop.is_set():
                try:
                    for _, wl in kube.watch("kueue.x-k8s.io/v1beta2", "Workload", project.namespace,
                                            resource_version=rv, timeout_seconds=5):
                        rv = (wl.get("metadata") or {}).get("resourceVersion") or rv
                        owner = next(iter((wl.get("metadata") or {}).get("ownerReferences") or []), {})
                        pk = by_job.get(owner.get("name", ""))
                        admitted = any(c.get("type") == "Admitted" and c.get("status") == "True"
                                       for c in (wl.get("status") or {}).get("conditions") or [])
                        if pk and admitted and pk not in seen_cluster:
                            seen_cluster[pk] = time.perf_counter()
                except Exception:  # an expired watch (410) or a cut stream: start again from now
                    rv = kube.list("kueue.x-k8s.io/v1beta2", "Workload", project.namespace)[1]

        def watch_portal() -> None:
            while not stop.is_set():
                for pk in WorkloadRequest.objects.filter(admitted_at__isnull=False).exclude(
                        pk__in=list(seen_portal)).values_list("pk", flat=True):
                    seen_portal[pk] = time.perf_counter()
                time.sleep(0.02)
            connections.close_all()

        for fn in (follow, watch_cluster, watch_portal):
            threads.append(threading.Thread(target=fn, daemon=True))
            threads[-1].start()
        quota = Quota.objects.get(project=project, flavor=flavor, resource="nvidia.com/gpu")
        lags: list[float] = []
        for i in range(samples):
            quota.nominal = Decimal(i + 1)
            quota.save(update_fields=["nominal"])
            Quota.objects.filter(tenant=tenant, project=None, flavor=flavor, resource="nvidia.com/gpu").update(
                nominal=Decimal(i + 1))
            reconcile(cluster, kube=kube)
            deadline = time.perf_counter() + 120
            while time.perf_counter() < deadline and len([pk for pk in seen_cluster if pk in seen_portal]) < i + 1:
                time.sleep(0.05)
        lags = sorted(seen_portal[pk] - seen_cluster[pk] for pk in seen_cluster if pk in seen_portal)
        if lags:
            print(f"   lag from Kueue's Admitted to the portal's database over {len(lags)} admissions: "
                  f"p50 {pct(lags, 50):.2f} s, p95 {pct(lags, 95):.2f} s, max {lags[-1]:.2f} s")
        else:
            print("   no admission was seen")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        real.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submit", type=int, default=1000)
    parser.add_argument("--workers", choices=["celery", "threads"], default="celery",
                        help="a real Celery worker (child process; needs REDIS_URL) or threads in this process")
    parser.add_argument("--concurrency", type=int, default=4, help="worker processes (or threads)")
    parser.add_argument("--http-clients", type=int, default=0,
                        help="submit over HTTP with this many concurrent clients against gunicorn (0: one client in "
                             "process)")
    parser.add_argument("--gunicorn-workers", type=int, default=4, help="gunicorn sync workers for --http-clients")
    parser.add_argument("--stages", action="store_true",
                        help="with --http-clients: the API takes every submission first with no worker running, then "
                             "the worker materializes the backlog; each stage's throughput and CPU")
    parser.add_argument("--still-cluster", action="store_true",
                        help="with --http-clients: the sandbox's controllers never run (its API server answers, nothing "
                             "admits or runs the Jobs): the portal's own throughput, without the simulated cluster's "
                             "work on the same CPUs")
    parser.add_argument("--cluster", choices=["sandbox", "real"], default="sandbox",
                        help="real: submissions go to the real control plane (make cluster-build first), and Kueue's "
                             "own admission rate is printed next to the portal's materialisation rate")
    parser.add_argument("--active", default="1000,5000")
    parser.add_argument("--changes", default="0,10,100")
    parser.add_argument("--follow-real", type=int, default=0, metavar="N",
                        help="with --cluster real: the follower's lag with N live Workloads on the real control plane")
    parser.add_argument("--samples", type=int, default=20, help="admissions timed by --follow-real")
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
            if args.submit and args.http_clients:
                bench_submit_http(args.submit, Path(tmp), clients=args.http_clients, servers=args.gunicorn_workers,
                                  concurrency=args.concurrency, stages=args.stages, still_cluster=args.still_cluster)
            elif args.submit:
                bench_submit(args.submit, Path(tmp), workers=args.workers, concurrency=args.concurrency,
                             real=args.cluster == "real")
            if args.cluster == "real" and args.follow_real:
                bench_follow_real(args.follow_real, args.samples, Path(tmp))
            bench_follow([int(x) for x in args.active.split(",") if x], [int(x) for x in args.changes.split(",") if x], Path(tmp))
    finally:
        connections.close_all()
        connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
