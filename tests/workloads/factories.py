"""A cluster, flavors, quota rows and the default catalogue, made directly with the models.

Quota rows are plain rows here (not the quota services), so these tests stand on their own:
acme-vision: 8 H100 nominal + 2 borrowable, 4 MIG 1g.10gb slices, no borrowing;
acme-nlp: 2 H100 with no borrowing limit (bounded by acme's pool of 12);
globex-llm: 4 H100, no borrowing.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from quotas.models import Cluster, Flavor, Quota
from tenants.models import Project
from workloads.catalogue import seed_catalogue
from workloads.models import RequestState, ServiceTemplate, WorkloadRequest


@dataclass
class Catalogue:
    cluster: Cluster
    h100: Flavor
    mig: Flavor
    cpu: Flavor
    notebook: ServiceTemplate
    training: ServiceTemplate
    inference: ServiceTemplate


def make_cluster(name: str = "lab") -> Cluster:
    return Cluster.objects.create(name=name, architecture="C", use_mig=True)


def make_flavors(cluster: Cluster) -> tuple[Flavor, Flavor, Flavor]:
    h100 = Flavor.objects.create(
        cluster=cluster, name="h100", display_name="H100 80GB", kind=Flavor.Kind.WHOLE,
        gpu_product="NVIDIA-H100-80GB-HBM3", gpu_model="h100-80gb", order=10,
    )
    mig = Flavor.objects.create(
        cluster=cluster, name="a100-1g.10gb", display_name="A100 1g.10gb", kind=Flavor.Kind.MIG,
        gpu_model="a100-80gb", mig_profile="1g.10gb", order=20,
    )
    cpu = Flavor.objects.create(cluster=cluster, name="cpu", display_name="CPU", kind=Flavor.Kind.CPU, order=90)
    return h100, mig, cpu


def make_quota(project: Project, flavor: Flavor, nominal: int, borrowing: int | None = 0, resource: str | None = None) -> Quota:
    return Quota.objects.create(
        tenant=project.tenant, project=project, flavor=flavor, resource=resource or flavor.primary_resource,
        nominal=Decimal(nominal), borrowing_limit=None if borrowing is None else Decimal(borrowing),
    )


def make_catalogue(cast: Any) -> Catalogue:
    cluster = make_cluster()
    h100, mig, cpu = make_flavors(cluster)
    seed_catalogue()
    make_quota(cast.vision, h100, 8, borrowing=2)
    make_quota(cast.vision, mig, 4, borrowing=0)
    make_quota(cast.nlp, h100, 2, borrowing=None)
    Quota.objects.create(tenant=cast.acme, project=None, flavor=h100, resource="nvidia.com/gpu", nominal=Decimal(12))
    make_quota(cast.llm, h100, 4, borrowing=0)
    templates = {t.slug: t for t in ServiceTemplate.objects.all()}
    return Catalogue(cluster, h100, mig, cpu, templates["notebook"], templates["training"], templates["inference"])


_names = iter(range(1, 10**9))


def make_request(cat: Catalogue, project: Project, user: Any, *, template: ServiceTemplate | None = None,
                 state: str = RequestState.PENDING_APPROVAL, **values: Any) -> WorkloadRequest:
    """A request row in any state, without the services (for state machine and listing tests)."""
    template = template or cat.training
    params = {"training": {"command": "python train.py"}, "inference": {"model_uri": "hf://m"}}.get(template.slug, {})
    fields: dict[str, Any] = {
        "tenant": project.tenant, "project": project, "cluster": cat.cluster, "template": template,
        "name": f"r{next(_names)}", "image": "nvcr.io/nvidia/pytorch:26.10-py3", "flavor": cat.h100, "gpus": 1,
        "parameters": params, "duration_hours": 4, "state": state, "requested_by": user,
    }
    fields.update(values)
    return WorkloadRequest.objects.create(**fields)
