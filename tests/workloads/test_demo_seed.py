"""The demo as ``make run`` seeds it, against the sandbox cluster: the H100 training zone runs architecture E, every
seeded flavor is enforced by it, training is gang-scheduled by Volcano (a Volcano Queue per project, a Volcano Job and
its PodGroup per request), and the request meant to wait for quota really waits in the project's Volcano Queue
instead of being admitted by borrowing, while the notebook and the inference service run on the online H100s Kueue
admits.

The seed command runs as ``make run`` runs it (sandbox reachable: inventory, flavors, quotas, first
reconcile); then the materialize and status tasks run in this process, as the worker and beat would.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from portal.kube import kube_cache_clear, kube_for
from quotas import manifests as m
from quotas.capacity import flavor_enforcement
from quotas.models import ArchitectureChange, Cluster
from tenants.models import Project
from workloads.models import RequestState, WorkloadRequest
from workloads.tasks import request_materialize_task, requests_sync_task

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(240)]
S = RequestState


VC_JOB = "batch.volcano.sh/v1alpha1"


def _quota_reserved(wl: dict) -> str:
    return next((c["status"] for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == "QuotaReserved"), "")


def _next_request_id(value: int) -> None:
    table = WorkloadRequest._meta.db_table
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, value - 1])
        else:
            cur.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
            cur.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, value - 1])


def test_demo_enforces_every_flavor_and_really_holds_one_request_for_quota(fresh_sandbox, settings, client) -> None:
    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    kube_cache_clear()
    # The requests' ids cross from two digits to three: the fine-tune's Job (req-100) sorts before the one-GPU job's
    # (req-98) by name, though it came later; Volcano takes them in the order they came (a suite that had made 97
    # requests before saw the fine-tune enqueued first, holding the whole queue).
    _next_request_id(98)
    call_command("seed_demo", stdout=io.StringIO())
    cluster = Cluster.objects.get(name="sandbox")
    kube = kube_for(cluster)
    # The H100 training zone runs E, and its last (seeded) architecture change says so.
    assert cluster.architecture == "E"
    last = ArchitectureChange.objects.filter(cluster=cluster).order_by("-finished_at").first()
    assert (last.from_architecture, last.to_architecture, last.state) == ("F", "E", "applied")

    flavors = list(cluster.flavors.all())
    assert {f.kind for f in flavors} == {"whole", "mig", "hami", "cpu"}
    refused = {f.name: flavor_enforcement(cluster, f).reason for f in flavors if not flavor_enforcement(cluster, f).enforced}
    assert refused == {}
    assert {f.name for f in flavors if flavor_enforcement(cluster, f).by == "volcano"} == {"h100-80gb-offline"}
    kueue = {f.name for f in flavors if flavor_enforcement(cluster, f).by == "kueue"}
    live = {o["metadata"]["name"] for o in kube.list(m.KUEUE, "ResourceFlavor")[0]}
    assert kueue <= live  # enforced means materialized: the seed's reconcile applied a ResourceFlavor for each
    assert "h100-80gb-offline" not in live  # Volcano's alone
    queue = kube.get(m.VOLCANO_QUEUE, "Queue", "acme-vision")  # nominal 6 + borrowing limit 2
    assert queue is not None and str(queue["spec"]["capability"]["nvidia.com/gpu"]) == "8"

    made = {r.name: r for r in WorkloadRequest.objects.filter(idempotency_key__startswith="demo-")}
    assert (made["resnet-baseline"].pk, made["llm-finetune"].pk) == (98, 100)
    assert set(made) == {"resnet-baseline", "explore-data", "llm-finetune", "hparam-sweep", "chat-demo"}
    assert {r.name: r.flavor.name for r in made.values()} == {
        "resnet-baseline": "h100-80gb-offline", "llm-finetune": "h100-80gb-offline", "hparam-sweep": "h100-80gb-offline",
        "explore-data": "h100-80gb-online", "chat-demo": "h100-80gb-online"}
    assert made["chat-demo"].state == S.APPROVED  # the project admin approved it: a service to call at once
    for req in sorted((r for r in made.values() if r.state == S.APPROVED), key=lambda r: r.pk):
        request_materialize_task.apply(args=[req.pk]).get()
    namespace = Project.objects.get(slug=made["llm-finetune"].project.slug).namespace

    def gang_running() -> bool:
        groups = kube.list(m.VOLCANO_QUEUE, "PodGroup", namespace=namespace)[0]
        job = WorkloadRequest.objects.get(pk=made["resnet-baseline"].pk)
        return job.state == S.RUNNING and any(
            g["metadata"]["ownerReferences"][0]["name"] == job.k8s_name and g.get("status", {}).get("phase") == "Running"
            for g in groups)

    # Twenty simulated seconds at least, then until the one-GPU job's gang runs (at most three minutes more): under
    # load a pod can be bound a step or several later than usual (the sandbox's controllers run in a thread of their
    # own, given real time by each step's status sync), and its start delay counts from then.
    for step in range(40):
        fresh_sandbox.advance(5)
        requests_sync_task.apply().get()
        if step >= 3 and gang_running():
            break

    # Training is gang-scheduled by Volcano: a Volcano Job in the project's Volcano Queue, with its PodGroup; no Kueue
    # Workload. The running one-GPU job's gang is Running; the fine-tune's waits in the queue.
    jobs = {j["metadata"]["name"]: j for j in kube.list(VC_JOB, "Job", namespace=namespace)[0]}
    running, waiting = (WorkloadRequest.objects.get(pk=made[n].pk) for n in ("resnet-baseline", "llm-finetune"))
    assert set(jobs) == {running.k8s_name, waiting.k8s_name}
    assert {j["spec"]["queue"] for j in jobs.values()} == {"acme-vision"}
    groups = {g["metadata"]["ownerReferences"][0]["name"]: g for g in kube.list(m.VOLCANO_QUEUE, "PodGroup", namespace=namespace)[0]}
    assert groups[running.k8s_name]["status"]["phase"] == "Running"
    assert groups[waiting.k8s_name]["status"]["phase"] != "Running"
    assert running.state == S.RUNNING
    assert waiting.state == S.QUEUED and waiting.pending_reason.startswith("waiting for 8 x"), waiting.pending_reason
    # In plain words, with the queue's own numbers: acme-vision's Queue may hold 8 (6 + 2 borrowing), the one-GPU job
    # holds 1 of them.
    assert "the project's Volcano queue may hold 8 and its running jobs use 1" in waiting.pending_reason, waiting.pending_reason
    assert "when its running jobs free 1" in waiting.pending_reason, waiting.pending_reason
    # The quota in use under E is the Volcano Queue's own count: the reconcile reads it back, and the approver's
    # inbox says "1 in use" next to hparam-sweep (a Kueue-only readback said 0 while the gang ran).
    from quotas.models import Quota
    from quotas.reconcile import reconcile

    reconcile(cluster, kube=kube)
    offline = Quota.objects.get(project__slug="acme-vision", flavor__name="h100-80gb-offline", resource="nvidia.com/gpu")
    assert offline.used == 1 and offline.borrowed == 0
    client.force_login(made["llm-finetune"].requested_by)
    inbox = client.get("/approvals/").content.decode()
    assert "6 nominal + 2 borrowable, 1 in use" in inbox, inbox[inbox.find("hparam-sweep"):][:2000]
    # The notebook and the service's replica are Kueue's (each pod of a Deployment is a Workload), on online H100s.
    workloads = kube.list(m.KUEUE, "Workload", namespace=namespace)[0]
    assert len(workloads) == 2 and all(_quota_reserved(w) == "True" for w in workloads), workloads
    assert {a["flavors"]["nvidia.com/gpu"] for w in workloads for a in w["status"]["admission"]["podSetAssignments"]} == {
        "h100-80gb-online"}
    for name in ("explore-data", "chat-demo"):
        assert WorkloadRequest.objects.get(pk=made[name].pk).state == S.RUNNING
    # The README's walk through the demo's service: carol makes a key on its endpoint page and calls it ten times in
    # a row with the README's body; the autoscaler takes it from 1 to 2 replicas (both admitted: acme-vision has four
    # online H100s, the notebook holds one).
    chat = made["chat-demo"]
    client.force_login(chat.requested_by)
    page = client.post(f"/requests/{chat.pk}/endpoint/keys/", {"name": "laptop"}, follow=True).content.decode()
    key = "gpk-" + page.split("<code>gpk-", 1)[1].split("</code>", 1)[0]
    client.logout()
    body = {"model": "demo/tiny-chat", "prompt": "Hello", "max_tokens": 8}
    for _ in range(10):
        answer = client.post(f"/inference/{chat.pk}/v1/completions", body, content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {key}")
        assert answer.status_code == 200, answer.content
    assert client.post(f"/inference/{chat.pk}/v1/completions", body, content_type="application/json").status_code == 401
    for _ in range(4):
        fresh_sandbox.advance(5)
        requests_sync_task.apply().get()
    assert WorkloadRequest.objects.get(pk=chat.pk).state_reason == "2 of 2 replicas ready."
    # It keeps waiting while the one-GPU job holds a GPU of the queue's 8: a new user who opens the demo minutes after
    # `make run` (three simulated hours later) still sees it held.
    fresh_sandbox.advance(3 * 3600)
    for _ in range(3):
        fresh_sandbox.advance(5)
        requests_sync_task.apply().get()
    assert WorkloadRequest.objects.get(pk=running.pk).state == S.RUNNING
    assert WorkloadRequest.objects.get(pk=waiting.pk).state == S.QUEUED
    # Once the one-GPU job has finished (its 8 simulated hours), Volcano starts the whole gang at once.
    fresh_sandbox.advance(6 * 3600)
    for _ in range(4):
        fresh_sandbox.advance(5)
        requests_sync_task.apply().get()
    assert WorkloadRequest.objects.get(pk=running.pk).state == S.SUCCEEDED
    assert WorkloadRequest.objects.get(pk=waiting.pk).state == S.RUNNING
