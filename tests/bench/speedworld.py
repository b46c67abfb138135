"""The data and the endpoints that ``tests/bench/speed.py`` and ``tests/test_query_counts_scale.py`` share.

``seed_base()`` makes the demo (tenants acme and globex, the users of every role, the demo cluster's flavors
and quotas without a cluster, the catalogue); ``seed_rows()`` adds rows with ``bulk_create`` in batches, so
100,000 requests take seconds, not minutes. It is additive: call it again to grow the same world.

Where the rows go: a share ``hot`` of the requests is in acme-vision (the project every measured user looks
at: carol submitted most of them, bob approves them), the rest round-robin over every other project; states
cycle through ``STATE_CYCLE`` (mostly finished, some running, queued and awaiting approval) for the newest
``live`` requests and through finished states only for the older ones (a history grows; what runs does not).
The hot project's requests have a two-step timeline; the others none.
Extra projects sit in extra tenants (``bench-t<i>``, ten projects each) with a tenant and project quota row
each; ``acme_projects`` adds projects to acme itself (alice's quota split page lists them).

``ENDPOINTS`` are the pages and API calls measured: (name, kind, who, path); ``who`` is a username (a
session) or ``token`` (carol's read token on acme-vision); ``{pk}`` is ``World.detail_pk``. frank is a member
of globex-llm only, one project among all the others: his lists are the "small project" ones.
"""

from __future__ import annotations

import itertools
import secrets
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from collections.abc import Iterator
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

BATCH = 5000

# One entry per request, in turn: 20 entries, so any 20 consecutive rows hold every state the pages show.
STATE_CYCLE = [
    "succeeded", "running", "pending_approval", "failed", "queued", "succeeded", "cancelled", "approved",
    "succeeded", "running", "stopped", "succeeded", "expired", "failed", "succeeded", "preempted",
    "rejected", "succeeded", "running", "succeeded",
]
FINAL = {"succeeded", "failed", "cancelled", "stopped", "expired", "rejected"}
# Requests older than the ``live`` newest ones are over: they cycle through these only.
HISTORY_CYCLE = ["succeeded", "failed", "succeeded", "cancelled", "succeeded", "stopped", "expired", "succeeded",
                 "rejected", "succeeded"]
QUOTA_STATUS_CYCLE = ["pending", "approved", "pending", "rejected", "cancelled", "pending", "approved", "reverted"]
APPROVER_CYCLE = ["project_admin", "tenant_admin", "ops"]
TEMPLATE_CYCLE = ["training", "notebook", "training", "inference", "training"]
PARAMETERS = {
    "training": {"command": "python train.py --epochs 20"},
    "notebook": {"ide": "jupyterlab"},
    "inference": {"model_uri": "hf://org/model"},
}
IMAGES = {"training": "nvcr.io/nvidia/pytorch:26.10-py3", "notebook": "jupyter/pytorch-notebook:2026.10",
          "inference": "vllm/vllm-openai:v0.12.0"}
HOT_PROJECT = "acme-vision"
GPU_FLAVOR = "h100-80gb-offline"
GPU = "nvidia.com/gpu"

# (name, kind, who, path). kind: floor (the minimal view), api, page.
ENDPOINTS: list[tuple[str, str, str, str]] = [
    ("floor list", "floor", "token", "/bench/floor/requests/"),
    ("floor detail", "floor", "token", "/bench/floor/requests/{pk}/"),
    ("API list (token)", "api", "token", "/api/v1/requests/"),
    ("API detail (token)", "api", "token", "/api/v1/requests/{pk}/"),
    ("API list (session)", "api", "carol", "/api/v1/requests/"),
    ("API detail (session)", "api", "carol", "/api/v1/requests/{pk}/"),
    ("API approvals inbox", "api", "bob", "/api/v1/approvals/"),
    ("API quota requests", "api", "bob", "/api/v1/quota-requests/"),
    ("API list (session, small project)", "api", "frank", "/api/v1/requests/"),
    ("page request list", "page", "carol", "/requests/"),
    ("page request list (projects)", "page", "carol", "/requests/?scope=projects"),
    ("page request list (small project)", "page", "frank", "/requests/?scope=projects"),
    ("page request detail", "page", "carol", "/requests/{pk}/"),
    ("page project detail", "page", "carol", f"/projects/{HOT_PROJECT}/"),
    ("page ops requests", "page", "ops", "/ops/requests/"),
    ("page capacity", "page", "ops", "/ops/capacity/"),
    ("page tenant quotas", "page", "alice", "/tenants/acme/quotas/"),
    ("page project quota", "page", "carol", f"/projects/{HOT_PROJECT}/quota/"),
    ("page quota requests", "page", "bob", "/quota-requests/"),
    ("page approvals inbox", "page", "bob", "/approvals/"),
]


@dataclass
class World:
    users: dict[str, Any]
    cluster: Any
    flavor: Any
    templates: dict[str, Any]
    token_raw: str = ""
    token: Any = None
    detail_pk: int = 0
    counts: dict[str, Any] = field(default_factory=dict)

    def path(self, template: str) -> str:
        return template.format(pk=self.detail_pk)


@contextmanager
def stamps_as_given(*models: Any) -> Iterator[None]:
    """Let bulk_create keep the created_at/updated_at values we set (auto_now/auto_now_add off meanwhile)."""
    saved = []
    for model in models:
        for f in model._meta.concrete_fields:
            if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                saved.append((f, f.auto_now, f.auto_now_add))
                f.auto_now = f.auto_now_add = False
    try:
        yield
    finally:
        for f, auto_now, auto_now_add in saved:
            f.auto_now, f.auto_now_add = auto_now, auto_now_add


def seed_base() -> World:
    """The demo world, without a cluster (``settings.KUBECONFIG`` must name a file that does not exist)."""
    from quotas.demo import seed_quota_demo
    from quotas.models import Cluster, Flavor
    from tenants.access import Actor
    from tenants.demo import seed_demo
    from tenants.models import Project
    from tenants.services import token_create
    from workloads.catalogue import seed_catalogue
    from workloads.models import ServiceTemplate

    seed_demo()
    seed_quota_demo(reconcile_now=False)
    seed_catalogue()
    User = get_user_model()
    users = {u.username: u for u in User.objects.filter(username__in=["ops", "alice", "bob", "carol", "dave", "erin", "frank"])}
    cluster = Cluster.objects.get(name="sandbox")
    world = World(users=users, cluster=cluster, flavor=Flavor.objects.get(cluster=cluster, name=GPU_FLAVOR),
                  templates={t.slug: t for t in ServiceTemplate.objects.filter(active=True)})
    project = Project.objects.get(slug=HOT_PROJECT)
    world.token, world.token_raw = token_create(actor=Actor(user=users["carol"]), project=project, name="bench-read",
                                                scope="read")
    return world


def _bulk(model: Any, rows: list[Any]) -> list[Any]:
    out = []
    for start in range(0, len(rows), BATCH):
        out += model.objects.bulk_create(rows[start:start + BATCH], batch_size=BATCH)
    return out


@transaction.atomic
def seed_rows(world: World, *, requests: int = 0, projects: int = 0, acme_projects: int = 0, members: int = 0,
              tokens: int = 0, quota_requests: int = 0, nodes: int = 0, hot: float = 0.2, live: int | None = None) -> None:
    """Add rows (see the module's docstring). ``projects``: extra projects in extra tenants; ``live``: only
    the newest ``live`` of the new requests may be in a live state (running, queued, awaiting approval...),
    the older ones are over (None: all may be live)."""
    from quotas.models import Node, Quota, QuotaRequest
    from tenants.access import permissions_sync
    from tenants.models import ApiToken, Membership, Project, Role, Tenant
    from workloads.models import WorkloadRequest

    User = get_user_model()
    now = timezone.now()
    users = world.users
    c = world.counts
    acme = Tenant.objects.get(slug="acme")

    # Extra tenants and their projects, ten projects per tenant, one member each.
    if projects:
        first = c.get("projects", 0)
        tenants_needed = sorted({(first + i) // 10 for i in range(projects)})
        existing = {t.slug: t for t in Tenant.objects.filter(slug__in=[f"bench-t{t}" for t in tenants_needed])}
        new_tenants = [Tenant(name=f"Bench tenant {t}", slug=f"bench-t{t}") for t in tenants_needed
                       if f"bench-t{t}" not in existing]
        for t in _bulk(Tenant, new_tenants):
            existing[t.slug] = t
        new_users = [User(username=f"bench-u{t}", email=f"bench-u{t}@example.com") for t in tenants_needed
                     if not User.objects.filter(username=f"bench-u{t}").exists()]
        for u in new_users:
            u.set_unusable_password()
        _bulk(User, new_users)
        owners = {u.username: u for u in User.objects.filter(username__in=[f"bench-u{t}" for t in tenants_needed])}
        rows = []
        for i in range(first, first + projects):
            slug = f"bench-t{i // 10}-p{i}"
            rows.append(Project(tenant=existing[f"bench-t{i // 10}"], name=f"Bench project {i}", slug=slug,
                                cluster_namespace=slug))
        made = _bulk(Project, rows)
        _bulk(Membership, [Membership(user=owners[f"bench-u{p.tenant.slug.removeprefix('bench-t')}"], tenant=p.tenant,
                                      project=p, role=Role.MEMBER) for p in made])
        _bulk(Quota, [Quota(tenant=t, project=None, flavor=world.flavor, resource=GPU, nominal=Decimal(20))
                      for t in new_tenants])
        _bulk(Quota, [Quota(tenant=p.tenant, project=p, flavor=world.flavor, resource=GPU, nominal=Decimal(2))
                      for p in made])
        c["projects"] = first + projects

    # Extra projects in acme: alice (tenant admin) sees them all; guardian rows through permissions_sync.
    if acme_projects:
        first = c.get("acme_projects", 0)
        made = _bulk(Project, [Project(tenant=acme, name=f"Acme bench {i}", slug=f"acme-bench-{i}",
                                       cluster_namespace=f"acme-bench-{i}") for i in range(first, first + acme_projects)])
        _bulk(Quota, [Quota(tenant=acme, project=p, flavor=world.flavor, resource=GPU, nominal=Decimal(1)) for p in made])
        for user in User.objects.filter(memberships__tenant=acme).distinct():
            permissions_sync(user=user, tenant=acme)
        c["acme_projects"] = first + acme_projects

    hot_project = Project.objects.get(slug=HOT_PROJECT)

    if members:
        first = c.get("members", 0)
        new_users = [User(username=f"bench-m{i}", email=f"bench-m{i}@example.com") for i in range(first, first + members)]
        for u in new_users:
            u.set_unusable_password()
        made = _bulk(User, new_users)
        _bulk(Membership, [Membership(user=u, tenant=acme, project=hot_project, role=Role.MEMBER) for u in made])
        c["members"] = first + members

    if tokens:
        _bulk(ApiToken, [ApiToken(name=f"bench-{i}", project=hot_project, user=users["carol"], scope="read",
                                  prefix=secrets.token_hex(4), secret_hash=secrets.token_hex(32),
                                  expires_at=now + timedelta(days=30)) for i in range(tokens)])

    if nodes:
        first = c.get("nodes", 0)
        labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpuportal.dev/pool": "offline",
                  "nvidia.com/gpu.count": "8"}
        _bulk(Node, [Node(cluster=world.cluster, name=f"bench-node-{i}", labels=labels, last_seen_at=now,
                          allocatable={"cpu": "192", "memory": "2Ti", GPU: "8", "pods": "110"})
                     for i in range(first, first + nodes)])
        c["nodes"] = first + nodes

    if quota_requests:
        first = c.get("quota_requests", 0)
        with stamps_as_given(QuotaRequest):
            _bulk(QuotaRequest, [
                QuotaRequest(project=hot_project, flavor=world.flavor, resource=GPU, amount=Decimal(1 + i % 4),
                             reason=f"bench {i}", requested_by=users["carol"],
                             status=QUOTA_STATUS_CYCLE[i % len(QUOTA_STATUS_CYCLE)],
                             approver=APPROVER_CYCLE[i % len(APPROVER_CYCLE)],
                             decided_by=None if QUOTA_STATUS_CYCLE[i % len(QUOTA_STATUS_CYCLE)] == "pending" else users["bob"],
                             created_at=now - timedelta(minutes=quota_requests - (i - first)))
                for i in range(first, first + quota_requests)
            ])
        c["quota_requests"] = first + quota_requests

    if requests:
        _seed_requests(world, requests, hot=hot, hot_project=hot_project, now=now, live=live)

    # The request the detail endpoints read: the newest running one in the hot project.
    world.detail_pk = (WorkloadRequest.objects.filter(project=hot_project, state="running")
                       .order_by("-created_at", "-id").values_list("pk", flat=True).first()) or 0


def _seed_requests(world: World, n: int, *, hot: float, hot_project: Any, now: Any, live: int | None) -> None:
    from tenants.models import Membership, Project
    from workloads.models import RequestEvent, WorkloadRequest

    users = world.users
    first = world.counts.get("requests", 0)
    others = list(Project.objects.exclude(pk=hot_project.pk).select_related("tenant").order_by("pk"))
    requester: dict[int, Any] = {}
    for m in Membership.objects.filter(project__in=others).select_related("user").order_by("role"):
        requester.setdefault(m.project_id, m.user)
    for p in others:  # a project without a member: its tenant admin submitted
        requester.setdefault(p.pk, users["erin"] if p.tenant.slug == "globex" else users["alice"])
    other_cycle = itertools.cycle(others) if others else None
    hot_every = max(1, round(1 / hot)) if hot > 0 else 0

    seen = world.counts.setdefault("_by_group", {"hot": 0, "other": 0})  # states cycle within each group
    for chunk in range(first, first + n, BATCH):
        rows = []
        for i in range(chunk, min(chunk + BATCH, first + n)):
            in_hot = other_cycle is None or bool(hot_every and i % hot_every == 0)
            group = "hot" if in_hot else "other"
            k = seen[group]
            seen[group] += 1
            recent = live is None or i >= first + n - live
            state = STATE_CYCLE[k % len(STATE_CYCLE)] if recent else HISTORY_CYCLE[k % len(HISTORY_CYCLE)]
            project = hot_project if in_hot else next(other_cycle)
            who = (users["carol"] if k % 10 < 7 else users["bob"]) if in_hot else requester[project.pk]
            slug = TEMPLATE_CYCLE[i % len(TEMPLATE_CYCLE)]
            created = now - timedelta(minutes=(first + n - i))
            started = created + timedelta(minutes=2) if state not in ("pending_approval", "approved", "queued", "rejected") else None
            decided = state not in ("pending_approval", "rejected")
            rows.append(WorkloadRequest(
                tenant_id=project.tenant_id, project_id=project.pk, cluster_id=world.cluster.pk,
                template_id=world.templates[slug].pk, name=f"r{i}", image=IMAGES[slug], flavor_id=world.flavor.pk,
                gpus=1 + i % 4, parameters=PARAMETERS[slug], duration_hours=8, priority="batch", state=state,
                requested_by_id=who.pk, approved_by_id=users["bob"].pk if decided else None,
                approved_at=created + timedelta(minutes=1) if decided else None,
                pending_reason="4 GPUs is more than the 2 the rule approves alone." if state == "pending_approval" else "",
                started_at=started, finished_at=created + timedelta(hours=1) if state in FINAL else None,
                expires_at=(started + timedelta(hours=8)) if started else None,
                created_at=created, updated_at=created + timedelta(minutes=3),
            ))
        with stamps_as_given(WorkloadRequest, RequestEvent):
            made = WorkloadRequest.objects.bulk_create(rows, batch_size=BATCH)
            # A timeline for the hot project's requests (the detail pages read it); the others go without.
            shown = [r for r in made if r.project_id == hot_project.pk]
            RequestEvent.objects.bulk_create(
                [RequestEvent(request_id=r.pk, at=r.created_at, to_state="submitted", actor_label="carol",
                              message="Submitted.") for r in shown]
                + [RequestEvent(request_id=r.pk, at=r.updated_at, from_state="submitted", to_state=r.state,
                                actor_label="system", message=f"Now {r.state}.") for r in shown], batch_size=BATCH)
    world.counts["requests"] = first + n


def make_clients(world: World) -> dict[str, Any]:
    """A test client per ``who`` of ``ENDPOINTS``: signed in (a session), or with the read token."""
    from django.test import Client
    from rest_framework.test import APIClient

    out: dict[str, Any] = {}
    token = APIClient()
    token.credentials(HTTP_AUTHORIZATION=f"Bearer {world.token_raw}")
    out["token"] = token
    for who in sorted({w for _, _, w, _ in ENDPOINTS if w != "token"}):
        client = Client()
        client.force_login(world.users[who])
        out[who] = client
    return out


def count_queries(client: Any, path: str) -> list[str]:
    """The SQL of one GET of ``path`` (after a first, warming GET); both must answer 200."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return [q["sql"] for q in ctx.captured_queries]
