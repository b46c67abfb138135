"""Federation benchmark (a script, not a test): 1,000 requests over three zones with one zone full.

    python tests/bench/federation_bench.py [--requests 1000] [--per-round 20] [--round-seconds 60] [--consent 0.7]

What it does, in a throwaway test database (PostgreSQL when DATABASE_URL points at one): three sandbox clusters in
this process, each with its own endpoint and kubeconfig, seeded as ``make run`` seeds them (``manage.py seed_demo``:
the H100 training zone, the A100 inference zone, the L40S development zone; acme-vision may spill to A100). acme-vision
(8 H100 it may use at once, 4 A100, 2 L40S) then submits ``--requests`` one-GPU training jobs through
``services.request_submit`` (the same path as the form and the API): 90 % H100 first, accepting A100 second, of which
``--consent`` consent to spill over; 10 % on L40S. The H100 zone is full from the start (four 2-GPU, 2-hour jobs hold
the project's 8 H100) and stays oversubscribed: the jobs run their duration (1 hour) in the sandbox's simulated time
(its duration annotation).

Time is the sandboxes' simulated clock: requests arrive ``--per-round`` at a time, each round every sandbox's clock
moves on ``--round-seconds`` and the status follower runs a cycle on each cluster; each approved request is
materialized right after its submission, so the routing of the next one reads the load the clusters really have.
A request's queue wait is the simulated time from the start of the round it was submitted in to the end of the round in
which its first admission was seen: whole rounds, rounded up (a job admitted in the round it arrived in shows one
round, 60 minutes by default). After the last submission, rounds go on until everything was
admitted. It runs twice, on fresh sandboxes: with spill-over (the project's policy allows A100) and without (the
policy off: every job waits for its own model).

Prints: the share spilled (of all, and of those that consented), the queue wait with and without spill-over (mean,
P50, P95, of all and of the H100-first jobs), and the dispatch latency (routing + submit: the time of
``request_submit``, which reads both candidate clusters' ClusterQueues when there is a choice), P50 / P95.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--requests", type=int, default=1000)
parser.add_argument("--per-round", type=int, default=20, help="submissions per round of simulated time")
parser.add_argument("--round-seconds", type=float, default=3600, help="simulated seconds per round")
parser.add_argument("--consent", type=float, default=0.7, help="share of H100-first jobs that consent")
parser.add_argument("--only", choices=["with", "without"], help="run one of the two (each on its own database)")
ARGS = parser.parse_args()

WORK = Path(tempfile.mkdtemp(prefix="federation-bench-"))
os.environ["PORTAL_KUBECONFIG"] = str(WORK / "sandbox.kubeconfig")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("CELERY_TASK_ALWAYS_EAGER", "false")

import django

django.setup()

from django.core.management import call_command
from django.db import connection
from django.test.utils import setup_test_environment

PROFILES = REPO / "sandbox" / "profiles"
SANDBOXES = [("sandbox.kubeconfig", None), ("zone-a100.kubeconfig", PROFILES / "zone-a100.yaml"),
             ("zone-l40s.kubeconfig", PROFILES / "zone-l40s.yaml")]


def start_sandboxes() -> list:
    from portal.kube import kube_cache_clear
    from sandbox.app import Sandbox

    kube_cache_clear()
    out = []
    for config, profile in SANDBOXES:
        (WORK / config).unlink(missing_ok=True)
        sb = Sandbox(kubeconfig=WORK / config, profile=profile)
        sb.start()
        out.append(sb)
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run(sandboxes: list, *, spill: bool) -> dict:
    from portal.kube import kube_for
    from quotas.models import Cluster, Flavor, SpillPolicy
    from quotas.reconcile import reconcile
    from tenants.access import Actor
    from tenants.models import Project
    from django.contrib.auth import get_user_model
    from django.db.models import Q
    from workloads import routing, services
    from workloads.materialize import request_materialize
    from workloads.models import RequestState, ServiceTemplate, WorkloadRequest
    from workloads.status import requests_sync

    S = RequestState
    clusters = list(Cluster.objects.all())
    for cluster in clusters:
        assert reconcile(cluster, kube=kube_for(cluster)).ok, cluster
    project = Project.objects.select_related("tenant").get(slug="acme-vision")
    SpillPolicy.objects.update_or_create(project=project, defaults={"allowed": spill, "target_models": ["a100-80gb"]})
    carol = Actor(user=get_user_model().objects.get(username="carol"))
    training = ServiceTemplate.objects.filter(slug="training", active=True).order_by("-version").first()
    h100 = Flavor.objects.get(cluster__name="sandbox", name="h100-80gb-offline")
    l40s = Flavor.objects.get(cluster__name="l40s-dev", gpu_model="l40s", kind="whole")
    assert training.allowed_flavors.filter(pk=l40s.pk).exists() and training.allowed_flavors.filter(
        cluster__name="a100-inference").exists(), "the training template must allow the zones' flavors"

    def sync() -> None:
        for sb in sandboxes:
            sb.advance(ARGS.round_seconds)
        for cluster in clusters:
            requests_sync(cluster=Cluster.objects.get(pk=cluster.pk), watch_seconds=1)

    # The H100 zone full: four 2-GPU jobs hold the project's 8 H100 (6 nominal + 2 borrowed).
    for i in range(4):
        req = services.request_submit(actor=carol, project=project, template=training, flavor=h100, gpus=2,
                                      duration_hours=2, parameters={"command": "python train.py"}, name=f"fill-{i}")
        request_materialize(request_id=req.pk)
    sync()

    submitted: dict[int, float] = {}  # request id -> simulated time of its submission
    admitted_at: dict[int, float] = {}
    first_model: dict[int, str] = {}
    consented: set[int] = set()
    latency: list[float] = []
    clock = 0.0
    n = 0
    rounds_after = idle = 0
    while n < ARGS.requests or (len(admitted_at) < len(submitted) and idle < 6):
        for _ in range(min(ARGS.per_round, ARGS.requests - n)):
            n += 1
            on_l40s = n % 10 == 0
            consent = not on_l40s and (n * 7919 % 100) < ARGS.consent * 100
            needs = routing.Needs(() if on_l40s else ("h100-80gb", "a100-80gb"), None, "", consent)
            started = time.perf_counter()
            req = services.request_submit(actor=carol, project=project, template=training, flavor=l40s if on_l40s else h100,
                                          gpus=1, duration_hours=1, parameters={"command": "python train.py"},
                                          name=f"b-{n}", needs=needs)
            latency.append(time.perf_counter() - started)
            submitted[req.pk] = clock
            first_model[req.pk] = "l40s" if on_l40s else "h100-80gb"
            if consent:
                consented.add(req.pk)
            if req.state == S.APPROVED:
                request_materialize(request_id=req.pk)
        if n >= ARGS.requests:
            rounds_after += 1
        sync()
        clock += ARGS.round_seconds
        if int(clock / ARGS.round_seconds) % 10 == 0:
            print(f"  round {int(clock / ARGS.round_seconds)}: {n} submitted, {len(admitted_at)} admitted", flush=True)
        before = len(admitted_at)
        # Admitted, or already finished (a job that ran its whole hour between two follower cycles has no admission
        # stamp: the follower saw it only as finished).
        seen = Q(first_admitted_at__isnull=False) | Q(started_at__isnull=False) | Q(finished_at__isnull=False)
        for pk in WorkloadRequest.objects.filter(seen, pk__in=[p for p in submitted if p not in admitted_at]
                                                 ).values_list("pk", flat=True):
            admitted_at[pk] = clock
        idle = idle + 1 if n >= ARGS.requests and len(admitted_at) == before else 0
    rows = {r.pk: r for r in WorkloadRequest.objects.filter(pk__in=list(submitted)).select_related("flavor")}
    never = [r for pk, r in rows.items() if pk not in admitted_at]
    if never:  # what was never admitted, and why (its state and reason)
        for r in never[:5]:
            print(f"  not admitted: {r.name} {r.state} on {r.flavor}: {r.state_reason or r.pending_reason}"[:300], flush=True)
    spilled = [pk for pk, r in rows.items() if r.spilled]
    waits = {pk: admitted_at[pk] - submitted[pk] for pk in admitted_at}
    h100_first = [w for pk, w in waits.items() if first_model[pk] == "h100-80gb"]
    return {"requests": len(submitted), "spilled": len(spilled), "never": len(never), "consented": len(consented),
            "spilled_of_consented": len([pk for pk in spilled if pk in consented]),
            "admitted": len(admitted_at), "waits": list(waits.values()), "h100_first": h100_first,
            "latency": latency, "rounds": int(clock / ARGS.round_seconds)}


def main() -> int:
    setup_test_environment()
    db = connection.settings_dict
    db.setdefault("TEST", {})["NAME"] = (str(WORK / "bench.sqlite3") if "sqlite" in db["ENGINE"]
                                         else f"federation_bench_{os.getpid()}")
    started = time.monotonic()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    print(f"database {db['NAME']} (migrated in {time.monotonic() - started:.0f} s); "
          f"{ARGS.requests} requests, {ARGS.per_round} per {ARGS.round_seconds:.0f} simulated s")
    results = {}
    sandboxes: list = []
    try:
        from workloads.models import WorkloadRequest

        sandboxes = start_sandboxes()
        started = time.monotonic()
        call_command("seed_demo", stdout=io.StringIO())
        print(f"seeded the three-zone demo in {time.monotonic() - started:.0f} s", flush=True)
        phases = [(label, spill) for label, spill in (("with spill-over", True), ("without spill-over", False))
                  if ARGS.only is None or label.split()[0] == ARGS.only]
        for i, (label, spill) in enumerate(phases):
            WorkloadRequest.objects.filter(seeded=False).delete()  # the demo's own and the last run's requests
            if i:
                for sb in sandboxes:
                    sb.stop()
                sandboxes = start_sandboxes()  # fresh clusters at the same kubeconfig paths
            started = time.monotonic()
            results[label] = run(sandboxes, spill=spill)
            print(f"{label}: ran in {time.monotonic() - started:.0f} s, {results[label]['rounds']} rounds")
    finally:
        for sb in sandboxes:
            sb.stop()
        connection.creation.destroy_test_db(old_name, verbosity=0)
    for label, r in results.items():
        w, h = [x / 60 for x in r["waits"]], [x / 60 for x in r["h100_first"]]
        print(f"\n{label}: {r['requests']} requests, {r['admitted']} admitted ({r['never']} never: see above)")
        print(f"  spilled: {r['spilled']} ({100 * r['spilled'] / r['requests']:.1f} % of all; "
              f"{r['spilled_of_consented']} of {r['consented']} that consented)")
        print(f"  queue wait, all (simulated minutes): mean {statistics.fmean(w):.1f}, P50 {pct(w, .5):.1f}, "
              f"P95 {pct(w, .95):.1f}")
        print(f"  queue wait, H100-first: mean {statistics.fmean(h):.1f}, P50 {pct(h, .5):.1f}, P95 {pct(h, .95):.1f}")
        lat = [x * 1000 for x in r["latency"]]
        print(f"  dispatch latency (routing + submit): P50 {pct(lat, .5):.1f} ms, P95 {pct(lat, .95):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
