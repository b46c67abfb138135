"""Template kinds as a registry: one module per kind (``notebook.py``, ``training.py``, ``inference.py``,
``batch_inference.py``).

A :class:`Kind` (``registry.py``) holds everything that differs per kind: its catalogue defaults, parameter schema
and curated images, its default priority, the render function that turns a request into Kubernetes objects, the
top-level objects the status follower reads its state from (and how), the actions it allows, and the traits the
other apps ask instead of naming a kind (``gang``, ``serving``, ``proxied``, ``interactive``, ``scalable``, the pods
and extra volumes billing prices). :func:`request_manifests` renders a request through its kind. Adding a kind means
adding one module here that calls :func:`register` (modules are discovered; ``Kind.order`` sets the catalogue
order), plus the migration Django writes for the new choice (docs/extending.md, "Template kinds").

Nothing here imports the models at import time: ``workloads/models.py`` builds ``TemplateKind`` from this registry.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from quotas import manifests as quota_manifests

from ..manifests import DEFAULT_JOB_TTL_SECONDS, Manifest, Target, installation_id
from .registry import (
    BASE_ACTIONS,
    FOLLOWABLE,
    KINDS,
    Derive,
    Kind,
    RenderOptions,
    TemplateDefaults,
    allows,
    choices,
    get,
    names,
    register,
    registered,
    top_level_keys,
    where,
)

if TYPE_CHECKING:  # pragma: no cover
    from quotas.models import Flavor

    from ..models import WorkloadRequest

__all__ = [
    "BASE_ACTIONS", "FOLLOWABLE", "KINDS", "Derive", "Kind", "RenderOptions", "TemplateDefaults", "allows", "choices",
    "get", "kueue_cannot_admit", "names", "register", "registered", "request_manifests", "target", "top_level_keys",
    "uses_volcano", "where",
]


def target(request: WorkloadRequest) -> Target:
    """Where and as what ``request`` lands, with what its kind declares (pod group, gang, serving)."""
    kind = get(request.template.kind)
    return Target(
        name=request.k8s_name,
        namespace=request.project.namespace,
        tenant=request.tenant.slug,
        project=request.project.slug,
        request_id=int(request.pk),
        kind=kind.name,
        architecture=request.cluster.architecture,
        priority=kind.default_priority if kind.priority_fixed else request.priority,
        installation=installation_id(),
        pod_group=kind.pod_group,
        gang=kind.gang,
        serving=kind.serving,
    )


def request_manifests(request: WorkloadRequest, *, notebook_token: str = "",
                      job_ttl_seconds: int | None = DEFAULT_JOB_TTL_SECONDS, inference_domain: str = "",
                      ingress_class: str = "", portal_url: str = "", **serving: Any) -> list[Manifest]:
    """Every object of ``request``, in apply order, rendered by its kind. ``notebook_token`` is an interactive kind's
    access token; ``job_ttl_seconds``: finished Jobs are deleted by the cluster after this long (None: kept);
    ``inference_domain`` (with ``ingress_class`` and ``portal_url``): where a serving kind's route lives (empty: none);
    ``serving``: the other :class:`RenderOptions` of serving kinds (``gateway_api``, ``gateway``, ``keda``...)."""
    t = target(request)
    options = RenderOptions(notebook_token=notebook_token, job_ttl_seconds=job_ttl_seconds,
                            inference_domain=inference_domain, ingress_class=ingress_class, portal_url=portal_url,
                            **serving)
    return get(t.kind).render(request, t, options)


def uses_volcano(request: WorkloadRequest, architecture: str | None = None) -> bool:
    """Does ``request`` run as a Volcano Job? Under E, a gang-scheduled kind on a Volcano-owned flavor (the offline
    pool's whole GPUs, ``quotas.manifests.volcano_owned``) does, single-node too: Kueue has no ResourceFlavor for
    those nodes. On any other flavor (online GPUs, MIG, HAMi) it stays with Kueue."""
    return get(request.template.kind).gang and quota_manifests.volcano_owned(request.cluster, request.flavor)


def kueue_cannot_admit(*, kind: str, flavor: Flavor) -> bool:
    """Would a request of template ``kind`` on ``flavor`` render to Kueue objects that Kueue can never admit?

    True for a kind that is not gang-scheduled on a Volcano-owned flavor (architecture E, offline whole GPUs): it
    renders to Kueue-managed objects, and Kueue has no ResourceFlavor for those nodes. A gang-scheduled kind there is a
    Volcano Job (:func:`uses_volcano`), single-node too, so it is never stranded."""
    return not get(kind).gang and quota_manifests.volcano_owned(flavor.cluster, flavor)


def _discover() -> None:
    """Import every module of this package: each registers its kind."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        importlib.import_module(f"{__name__}.{info.name}")


_discover()
