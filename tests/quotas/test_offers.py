"""Offers must be what can run (issue 27): under every reference architecture (``quotas.architectures``), every
(project, template, flavor) that the new-request form, the catalogue, the API and the CLI offer can be admitted by
the queues the portal renders for it, given enough free capacity.

The data is the demo as ``make run`` seeds it (tenants, quotas, catalogue; no cluster: the demo profile's flavors).
The offers are read through the real interfaces: the catalogue page and the form as each person who may submit
sees them (per project), the templates API with ``?project=``, and the CLI's "valid flavors" (its own function,
against the live server). Each offer is then rendered as the request it would be (``workloads.manifests``, pure) and
checked against the rendered queues (``quotas.manifests.desired_state``, pure) with the sandbox's model of Kueue's
quota (``sandbox.controllers.kueue.Quota``: nominal, cohort pool, borrowing limits; its resource transformations;
its node-affinity check), or of the project's Volcano Queue: an offer the queues can never admit fails here instead
of waiting forever on a cluster.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client as DjangoClient

from gpuportal_cli.client import Client as CliClient
from gpuportal_cli.main import _valid_flavors
from portal.cache import changed as cache_changed
from portal.labels import QUEUE_NAME_LABEL
from portal.quantities import parse_quantity
from quotas import architectures
from quotas import manifests as qm
from quotas.demo import seed_quota_demo
from quotas.models import Cluster, Flavor
from quotas.reconcile import snapshot_load
from sandbox.controllers.kueue import DEFAULT_TRANSFORMATIONS, Kueue, transform
from sandbox.controllers.kueue import Quota as KueueQuota
from tenants.access import Actor
from tenants.demo import seed_demo
from tenants.models import ApiToken, Project
from tenants.selectors import projects_where
from tenants.services import token_create
from workloads import kinds
from workloads.catalogue import seed_catalogue
from workloads.models import ServiceTemplate, WorkloadRequest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]
Offer = tuple[str, str, str]  # (project slug, template slug, flavor name)


@pytest.fixture
def demo(settings, tmp_path) -> Cluster:
    settings.KUBECONFIG = str(tmp_path / "no-cluster")  # unreachable: the seed uses the demo profile's flavors
    seed_demo()
    seed_quota_demo(reconcile_now=False)
    seed_catalogue()
    return Cluster.objects.get(name="sandbox")


def _submitters() -> dict[str, list[Project]]:
    from django.contrib.auth import get_user_model

    out = {}
    for user in get_user_model().objects.filter(is_staff=False, is_superuser=False):
        projects = list(projects_where(actor=Actor(user=user), perm="submit_project").filter(status="active"))
        if projects:
            out[user.username] = projects
    return out


def _offers(live_url: str, people: dict[str, list[Project]]) -> dict[str, set[Offer]]:
    """What each interface offers, per project, to everyone who may submit there."""
    from django.contrib.auth import get_user_model

    found: dict[str, set[Offer]] = defaultdict(set)
    for username, projects in people.items():
        user = get_user_model().objects.get(username=username)
        web = DjangoClient()
        web.force_login(user)
        for project in projects:
            page = web.get("/requests/new/", {"project": project.slug})
            assert page.status_code == 200
            for template in page.context["templates"]:
                found["catalogue"] |= {(project.slug, template.slug, f.name) for f in template.offered_flavors}
                form = web.get("/requests/new/", {"template": template.slug, "project": project.slug})
                assert form.status_code == 200
                flavors = form.context["form"].flavors
                found["form"] |= {(project.slug, template.slug, flavors[pk].name)
                                  for pk, _label in form.context["form"].fields["flavor"].choices}
            web_api = DjangoClient()
            web_api.force_login(user)
            listed = web_api.get("/api/v1/templates/", {"project": project.slug}).json()
            for template in listed["results"]:
                found["api"] |= {(project.slug, template["slug"], f["name"]) for f in template["allowed_flavors"]}
            _, token = token_create(actor=Actor(user=user), project=project, name=f"offers-{project.slug}",
                                    scope=ApiToken.Scope.SUBMIT)
            cli = CliClient(live_url, token, retries=0)
            for template in listed["results"]:
                _what, names = _valid_flavors(cli, template["slug"], project.slug)
                found["cli"] |= {(project.slug, template["slug"], name) for name in names}
    return found


# ----------------------------------------------------------------------------------------- the independent check
def _pod_templates(obj: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    spec = obj.get("spec") or {}
    if obj["kind"] == "Job" and obj["apiVersion"].startswith("batch.volcano.sh"):
        return [(t["template"], int(t.get("replicas", 1))) for t in spec.get("tasks") or []]
    if "template" in spec:
        return [(spec["template"], int(spec.get("parallelism") or spec.get("replicas") or 1))]
    return []


def _requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = defaultdict(Decimal)
    for container in pod["spec"]["containers"]:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] += parse_quantity(value)
    return transform(dict(total), DEFAULT_TRANSFORMATIONS)


def _why_not_admitted(objects: list[dict[str, Any]], request: WorkloadRequest) -> str | None:
    """None when the rendered queues can admit the rendered request given enough free capacity, else why not."""
    rendered = kinds.request_manifests(request)
    top = [o for o in rendered if _pod_templates(o)]
    assert len(top) == 1, [o["kind"] for o in rendered]
    obj = top[0]
    if obj["apiVersion"].startswith("batch.volcano.sh"):
        queue = next((o for o in objects if o["kind"] == "Queue" and o["metadata"]["name"] == obj["spec"]["queue"]), None)
        if queue is None:
            return f"no Volcano Queue {obj['spec']['queue']}"
        capability = queue["spec"].get("capability") or {}
        need = defaultdict(Decimal)
        for pod, count in _pod_templates(obj):
            for name, value in _requests(pod).items():
                need[name] += value * count
        short = [r for r, v in need.items() if r.startswith("nvidia.com/") and parse_quantity(capability.get(r, 0)) < v]
        return f"Volcano Queue capability lacks {short}" if short else None
    queue_name = obj["metadata"]["labels"][QUEUE_NAME_LABEL]
    lq = next((o for o in objects if o["kind"] == "LocalQueue" and o["metadata"]["namespace"] == request.project.namespace
               and o["metadata"]["name"] == queue_name), None)
    if lq is None:
        return f"no LocalQueue {queue_name}"
    cqs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterQueue"}
    cohorts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Cohort"}
    flavors = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ResourceFlavor"}
    cq_name = lq["spec"]["clusterQueue"]
    quota = KueueQuota(cqs, cohorts)
    groups = cqs[cq_name]["spec"]["resourceGroups"]
    for pod, count in _pod_templates(obj):
        need = {r: v * count for r, v in _requests(pod).items()}
        for group in groups:
            wanted = {r: v for r, v in need.items() if r in group["coveredResources"]}
            if not wanted:
                continue
            gpu_group = any(r.startswith("nvidia.com/") for r in wanted)
            candidates = [f["name"] for f in group["flavors"] if not gpu_group or f["name"] == request.flavor.name]
            fits = [name for name in candidates if name in flavors
                    and Kueue._flavor_compatible(None, flavors[name], pod) is None  # type: ignore[arg-type]
                    and all(quota.potential(cq_name, (name, r)) >= v for r, v in wanted.items())]
            if not fits:
                return f"ClusterQueue {cq_name} cannot admit {wanted} in {candidates or 'no listed flavor'}"
        uncovered = [r for r in need if not any(r in g["coveredResources"] for g in groups)]
        if uncovered:
            return f"ClusterQueue {cq_name} covers none of {uncovered}"
    return None


def _request_for(project: Project, template: ServiceTemplate, flavor: Flavor) -> WorkloadRequest:
    params = {"training": {"command": "python train.py"}, "inference": {"model_uri": "hf://m"}}.get(template.kind, {})
    return WorkloadRequest(
        pk=1, tenant=project.tenant, project=project, cluster=flavor.cluster, template=template, flavor=flavor,
        name="offer", image="nvcr.io/nvidia/pytorch:26.10-py3", gpus=1, replicas=1, cpu=Decimal(template.default_cpu),
        memory_gib=template.default_memory_gib, parameters=params, duration_hours=1, priority="batch",
    )


def test_every_offer_under_every_architecture_can_be_admitted(demo, live_server) -> None:
    people = _submitters()
    assert {"carol", "frank"} <= set(people)
    seen: dict[str, int] = {}
    for letter in architectures.letters():
        Cluster.objects.filter(pk=demo.pk).update(architecture=letter, use_mig=True, use_hami=True)
        cache_changed("catalogue")
        cluster = Cluster.objects.get(pk=demo.pk)
        objects = qm.desired_state(cluster, snapshot_load(cluster))
        offers = _offers(live_server.url, people)
        # Every interface offers the same: the form's offers are the catalogue's, the API's and the CLI's.
        assert offers["catalogue"] == offers["form"] == offers["api"] == offers["cli"], letter
        assert offers["form"], f"architecture {letter} offers nothing at all"
        templates = {t.slug: t for t in ServiceTemplate.objects.filter(active=True)}
        flavors = {f.name: f for f in Flavor.objects.filter(cluster=cluster).select_related("cluster")}
        projects = {p.slug: p for p in Project.objects.select_related("tenant")}
        stranded = {}
        for project, template, flavor in sorted(offers["form"]):
            why = _why_not_admitted(objects, _request_for(projects[project], templates[template], flavors[flavor]))
            if why:
                stranded[(project, template, flavor)] = why
        assert stranded == {}, f"architecture {letter}: offered but never admitted: {stranded}"
        seen[letter] = len(offers["form"])
    assert set(seen) == set(architectures.letters()), seen


def test_whole_gpu_inference_is_offered_under_f_only_where_offline_gpus_are_lent(demo) -> None:
    """The case of issue 27: under F, inference goes to the project's online queue, which has offline H100s only
    where they are lent to the cohort (explicit lending). When acme-vision lends two, any online queue of acme may
    borrow them. With nothing lent, the form does not offer them, and a submission through the API is refused with
    the queue named. (The demo's H100 zone runs E; this is the demo's cluster switched to F.)"""
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from quotas.models import Quota

    Cluster.objects.filter(pk=demo.pk).update(architecture="F")
    Quota.objects.filter(project__slug="acme-vision", flavor__name="h100-80gb-offline").update(lending_limit=2)
    cache_changed("catalogue")
    cluster = Cluster.objects.get(pk=demo.pk)
    assert cluster.architecture == "F"
    web = DjangoClient()
    web.force_login(get_user_model().objects.get(username="carol"))
    api = APIClient()
    api.force_authenticate(get_user_model().objects.get(username="carol"))

    def offered(template: str) -> set[str]:
        form = web.get("/requests/new/", {"template": template, "project": "acme-vision"})
        return {f.name for f in form.context["form"].flavors.values()}

    lent = Quota.objects.filter(project__slug="acme-vision", flavor__name="h100-80gb-offline")
    assert list(lent.values_list("lending_limit", flat=True)) == [2]
    assert "h100-80gb-offline" in offered("inference")
    # Nothing lent, through the API as the tenant admin (what the queues offer is kept per process: a write through
    # the services is seen at once, quotas.selectors.OFFERS).
    admin = APIClient()
    admin.force_authenticate(get_user_model().objects.get(username="alice"))
    unlent = admin.patch(f"/api/v1/quotas/{lent.get().pk}/", {"lending_limit": None}, format="json")
    assert unlent.status_code == 200, unlent.content
    cache_changed("catalogue")  # no signal from a queryset update
    assert "h100-80gb-offline" not in offered("inference")
    assert "h100-80gb-offline" in offered("training")
    response = api.post("/api/v1/requests/", {
        "template": "inference", "project": "acme-vision", "flavor": "h100-80gb-offline", "gpus": 1,
        "parameters": {"model_uri": "hf://m"}}, format="json")
    assert response.status_code == 400, response.content
    assert "acme-vision-online" in str(response.json()), response.json()


def test_the_demo_h100_zone_runs_e_training_on_volcanos_pool_and_inference_on_the_online_h100s(demo) -> None:
    """The demo as ``make run`` seeds it: the H100 training zone runs E, so the offline H100s are Volcano's (training
    only: a gang) and acme-vision's notebooks and inference go to its online H100s, which Kueue admits. A submission
    of inference on the offline pool is refused saying only Volcano schedules there."""
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    assert Cluster.objects.get(pk=demo.pk).architecture == "E"
    web = DjangoClient()
    web.force_login(get_user_model().objects.get(username="carol"))

    def offered(template: str) -> set[str]:
        form = web.get("/requests/new/", {"template": template, "project": "acme-vision"})
        return {f.name for f in form.context["form"].flavors.values() if f.name.startswith("h100")}

    assert offered("training") == {"h100-80gb-offline", "h100-80gb-online"}
    assert offered("inference") == {"h100-80gb-online"}
    assert offered("notebook") == {"h100-80gb-online"}
    api = APIClient()
    api.force_authenticate(get_user_model().objects.get(username="carol"))
    response = api.post("/api/v1/requests/", {
        "template": "inference", "project": "acme-vision", "flavor": "h100-80gb-offline", "gpus": 1,
        "parameters": {"model_uri": "hf://m"}}, format="json")
    assert response.status_code == 400, response.content
    assert "only Volcano schedules" in str(response.json()["fields"]["flavor"]), response.json()
    assert not WorkloadRequest.objects.exists()
