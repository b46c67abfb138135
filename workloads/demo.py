"""Demo requests, so a newcomer sees a live system at once: a running training job, one pending for quota,
one awaiting approval, a notebook, and an inference service (approved by the project admin, so it runs: a key on its
endpoint page and the README's curl call it through the portal's proxy).

``seed_request_demo()`` runs after ``tenants.demo.seed_demo()``, ``quotas.demo.seed_quota_demo()`` (cluster,
flavors, quotas, reconciled into the sandbox) and ``workloads.catalogue.seed_catalogue()``. It submits through
the services, like a user, with idempotency keys, so running it again creates nothing. The Celery worker then
materializes the approved ones and the status follower moves them along (running, or pending with the reason).
"""

from __future__ import annotations

import logging

from quotas.models import Flavor, Quota
from tenants.access import Actor
from tenants.models import Membership, Role

from . import services
from .models import RequestState, ServiceTemplate, WorkloadRequest

logger = logging.getLogger(__name__)
TRAINING_IMAGE = "nvcr.io/nvidia/pytorch:26.10-py3"
NOTEBOOK_IMAGE = "jupyter/pytorch-notebook:2026.10"
INFERENCE_IMAGE = "vllm/vllm-openai:v0.12.0"
INFERENCE_NAME = "chat-demo"


def _pick() -> tuple[Quota, Membership, Membership] | None:
    """A project with whole-GPU quota that has a project admin and a member to act as."""
    rows = (
        Quota.objects.filter(project__isnull=False, flavor__kind=Flavor.Kind.WHOLE, flavor__active=True, nominal__gt=0,
                             resource="nvidia.com/gpu", project__status="active")
        .select_related("project", "flavor", "flavor__cluster")
        .order_by("-nominal", "project__slug")
    )
    for row in rows:
        members = Membership.objects.filter(project=row.project).select_related("user")
        admin = next((m for m in members if m.role == Role.PROJECT_ADMIN), None)
        member = next((m for m in members if m.role == Role.MEMBER), None)
        template = ServiceTemplate.objects.filter(slug="training", active=True).first()
        if admin and member and template and template.allowed_flavors.filter(pk=row.flavor_id).exists():
            return row, admin, member
    return None


def seed_request_demo() -> list[WorkloadRequest]:
    """Submit the demo requests that are missing. Returns them (empty when there is nothing to seed on)."""
    picked = _pick()
    if picked is None:
        logger.warning("request demo skipped: no project with whole-GPU quota, a project admin and a member")
        return []
    quota, admin, member = picked
    project, flavor = quota.project, quota.flavor
    templates = {t.slug: t for t in ServiceTemplate.objects.filter(active=True).order_by("slug", "-version")}
    nominal = int(quota.nominal)
    borrow = int(quota.borrowing_limit) if quota.borrowing_limit is not None else 0
    made: list[WorkloadRequest] = []

    def submit(who: Membership, key: str, template: str, *, elsewhere: bool = False, **values) -> None:
        # ``elsewhere``: when the training flavor does not take this kind (architecture E: Volcano's offline pool takes
        # gangs only), the project's other whole-GPU flavors of the cluster are tried in order (E: the online pool).
        tries = [flavor] + (_other_flavors(project, flavor, templates[template]) if elsewhere else [])
        for i, on in enumerate(tries):
            try:
                made.append(services.request_submit(actor=Actor(user=who.user), project=project, template=templates[template],
                                                    idempotency_key=f"demo-{key}", flavor=on, **values))
                return
            except Exception:  # a demo request the rules refuse must not stop the demo
                if i == len(tries) - 1:
                    logger.exception("demo request %s not submitted", key)

    # Running: a one-GPU training job, approved by the global rule; it finishes after its 8 simulated hours (under
    # architecture E a Volcano Job: a gang of one in the project's Volcano Queue).
    submit(member, "training-running", "training", image=TRAINING_IMAGE, gpus=1, duration_hours=8,
           parameters={"command": "python train.py --epochs 20", "env": {"WANDB_MODE": "offline"}}, name="resnet-baseline")
    # A notebook (one GPU, auto-approved): on the training flavor where it takes notebooks, else (E) on an online H100.
    submit(member, "notebook", "notebook", elsewhere=True, image=NOTEBOOK_IMAGE, gpus=1, duration_hours=8,
           parameters={"ide": "jupyterlab"}, name="explore-data")
    # Pending for quota: the project admin approves it (as submitter), but it needs every GPU the project may
    # use on the flavor (nominal + borrowing), so it waits for as long as the running training job holds one (hours
    # of portal time; under F the notebook holds one too): under E in the project's Volcano Queue, under F in Kueue.
    want = min(nominal + borrow, 8)
    if want >= 2:
        submit(admin, "training-pending", "training", image=TRAINING_IMAGE, gpus=want, duration_hours=4,
               parameters={"command": "torchrun --nproc-per-node 8 train.py"}, name="llm-finetune")
    # Awaiting approval: more than the rule approves alone (2 GPUs, 8 h).
    submit(member, "training-approval", "training", image=TRAINING_IMAGE, gpus=min(4, max(3, nominal)), duration_hours=24,
           parameters={"command": "python sweep.py"}, name="hparam-sweep")
    service = _inference_demo(project, flavor.cluster, admin, member, templates.get("inference"))
    if service is not None:
        made.append(service)
    return made


def _other_flavors(project, flavor: Flavor, template: ServiceTemplate) -> list[Flavor]:
    """The project's other whole-GPU flavors on ``flavor``'s cluster that ``template`` allows, in the catalogue's order."""
    return list(Flavor.objects.filter(pk__in=Quota.objects.filter(project=project, nominal__gt=0).values("flavor_id"),
                                      cluster_id=flavor.cluster_id, active=True, kind=Flavor.Kind.WHOLE)
                .filter(pk__in=template.allowed_flavors.values("pk")).exclude(pk=flavor.pk).order_by("order", "name"))


def _inference_demo(project, cluster, admin: Membership, member: Membership,
                    template: ServiceTemplate | None) -> WorkloadRequest | None:
    """A one-GPU model server the member asked for and the project admin approved (inference always waits for an
    approver: the online class), autoscaled between 1 and 2 replicas, on the first flavor of the demo's own cluster
    that its template and the project's quota take (architecture E: the online H100s Kueue admits, F: the online
    pool)."""
    if template is None:
        return None
    flavors = Flavor.objects.filter(pk__in=Quota.objects.filter(project=project, nominal__gt=0).values("flavor_id"),
                                    cluster=cluster, active=True, kind=Flavor.Kind.WHOLE).order_by("order", "name")
    for flavor in flavors.filter(pk__in=template.allowed_flavors.values("pk")):
        try:
            req = services.request_submit(
                actor=Actor(user=member.user), project=project, template=template, flavor=flavor,
                idempotency_key="demo-inference", image=INFERENCE_IMAGE, gpus=1, replicas=2, duration_hours=720,
                parameters={"model_uri": "hf://demo/tiny-chat", "min_replicas": 1, "target_requests_per_second": 0.05},
                name=INFERENCE_NAME)
        except Exception as exc:  # this flavor is refused (no online quota, not admitted): try the next
            logger.info("demo inference service not on %s: %s", flavor, exc)
            continue
        if req.state == RequestState.PENDING_APPROVAL:
            req = services.request_approve(actor=Actor(user=admin.user), request=req, comment="Demo service.")
        return req
    logger.warning("demo inference service skipped: no flavor of %s takes it in %s", template.slug, project.slug)
    return None


def seed_zone_templates() -> int:
    """The demo's other zones (quotas.demo.seed_zone_demo) in the catalogue: each template that allows none of a
    zone's whole-GPU flavors yet is allowed them (``seed_catalogue`` allows the first cluster's flavors only), so
    routing may send work there. Returns the flavors allowed."""
    from quotas.demo import DEMO_ZONES

    added = 0
    flavors = list(Flavor.objects.filter(cluster__name__in=[z["name"] for z in DEMO_ZONES], kind=Flavor.Kind.WHOLE,
                                         active=True))
    for template in ServiceTemplate.objects.filter(active=True):
        allowed = set(template.allowed_flavors.values_list("cluster_id", flat=True))
        fresh = [f for f in flavors if f.cluster_id not in allowed]
        if fresh:
            template.allowed_flavors.add(*fresh)
            added += len(fresh)
    return added

