"""The demo as ``make run`` seeds it, against the sandbox cluster: every seeded flavor is enforced by the
architecture the demo starts on, and the request meant to wait for quota really waits (its Workload stays
``QuotaReserved=False``) instead of being admitted by borrowing.

The seed command runs as ``make run`` runs it (sandbox reachable: inventory, flavors, quotas, first
reconcile); then the materialize and status tasks run in this process, as the worker and beat would.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from portal.kube import kube_cache_clear, kube_for
from quotas import manifests as m
from quotas.capacity import flavor_enforcement
from quotas.models import Cluster
from tenants.models import Project
from workloads.models import RequestState, WorkloadRequest
from workloads.tasks import request_materialize_task, requests_sync_task

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(240)]
S = RequestState


def _quota_reserved(wl: dict) -> str:
    return next((c["status"] for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == "QuotaReserved"), "")


def test_demo_enforces_every_flavor_and_really_holds_one_request_for_quota(fresh_sandbox, settings, client) -> None:
    settings.KUBECONFIG = str(fresh_sandbox.kubeconfig)
    kube_cache_clear()
    call_command("seed_demo", stdout=io.StringIO())
    cluster = Cluster.objects.get(name="sandbox")
    kube = kube_for(cluster)

    flavors = list(cluster.flavors.all())
    assert {f.kind for f in flavors} == {"whole", "mig", "hami", "cpu"}
    refused = {f.name: flavor_enforcement(cluster, f).reason for f in flavors if not flavor_enforcement(cluster, f).enforced}
    assert refused == {}
    kueue = {f.name for f in flavors if flavor_enforcement(cluster, f).by == "kueue"}
    live = {o["metadata"]["name"] for o in kube.list(m.KUEUE, "ResourceFlavor")[0]}
    assert kueue <= live  # enforced means materialized: the seed's reconcile applied a ResourceFlavor for each

    made = {r.name: r for r in WorkloadRequest.objects.filter(idempotency_key__startswith="demo-")}
    assert set(made) == {"resnet-baseline", "explore-data", "llm-finetune", "hparam-sweep", "chat-demo"}
    assert made["chat-demo"].state == S.APPROVED  # the project admin approved it: a service to call at once
    for req in sorted((r for r in made.values() if r.state == S.APPROVED), key=lambda r: r.pk):
        request_materialize_task.apply(args=[req.pk]).get()
    for _ in range(4):
        fresh_sandbox.advance(5)
        requests_sync_task.apply().get()

    namespace = Project.objects.get(slug=made["llm-finetune"].project.slug).namespace
    workloads = kube.list(m.KUEUE, "Workload", namespace=namespace)[0]
    held = [wl for wl in workloads if _quota_reserved(wl) == "False"]
    admitted = [wl for wl in workloads if _quota_reserved(wl) == "True"]
    # Admitted: the training job, the notebook and the service's replica (each pod of a Deployment is a Workload).
    assert len(held) == 1 and len(admitted) == 3, [(w["metadata"]["name"], _quota_reserved(w)) for w in workloads]
    waiting = WorkloadRequest.objects.get(pk=made["llm-finetune"].pk)
    assert held[0]["metadata"]["ownerReferences"][0]["name"] == waiting.k8s_name
    assert waiting.state == S.QUEUED and waiting.pending_reason.startswith("waiting for"), waiting.pending_reason
    for name in ("resnet-baseline", "explore-data", "chat-demo"):
        assert WorkloadRequest.objects.get(pk=made[name].pk).state == S.RUNNING
    # The README's walk through the demo's service: carol makes a key on its endpoint page and calls it ten times in
    # a row with the README's body; the autoscaler takes it from 1 to 2 replicas (both admitted: acme-vision lends
    # two offline H100s to its online queue).
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
    # It keeps waiting: more time changes nothing while the others hold the quota.
    fresh_sandbox.advance(5)
    requests_sync_task.apply().get()
    wl = kube.get(m.KUEUE, "Workload", held[0]["metadata"]["name"], namespace)
    assert _quota_reserved(wl) == "False"
    # And it still waits once the short training job has finished (two simulated hours later): it needs the
    # notebook's GPU too, so a new user who opens the demo minutes after `make run` still sees it held.
    fresh_sandbox.advance(3 * 3600)
    for _ in range(3):
        fresh_sandbox.advance(5)
        requests_sync_task.apply().get()
    assert WorkloadRequest.objects.get(pk=made["resnet-baseline"].pk).state == S.SUCCEEDED
    wl = kube.get(m.KUEUE, "Workload", held[0]["metadata"]["name"], namespace)
    assert _quota_reserved(wl) == "False"
    assert WorkloadRequest.objects.get(pk=made["llm-finetune"].pk).state == S.QUEUED
