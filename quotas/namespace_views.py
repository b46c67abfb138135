"""Ops page for one project namespace on one cluster: who owns it, what is inside, adopt or delete it.

``/ops/clusters/<cluster>/namespaces/<project slug>/`` shows the owner labels and object counts by kind;
the two forms post back the total ops were shown (``confirm``), so nothing is adopted or deleted
without having seen what is inside (docs/ownership.md).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.kube import ClusterError
from tenants.guards import ops_only as _ops_only
from tenants.selectors import projects_for

from . import namespaces
from .views import _ops_cluster, _ops_page


def _confirm(request: HttpRequest) -> int | None:
    value = request.POST.get("confirm", "")
    return int(value) if value.isdigit() else None


@login_required
def namespace_detail(request: HttpRequest, name: str, slug: str) -> HttpResponse:
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    project = get_object_or_404(projects_for(actor=actor), slug=slug)
    info, error = None, None
    try:
        info = namespaces.namespace_inspect(cluster, project.namespace)
    except ClusterError as exc:
        error = f"The cluster could not be asked: {exc}"
    except PortalError as exc:  # no way to ask it (no kubeconfig): said on the page, not an error page
        error = getattr(exc, "message", str(exc))
    context = {"tab": "objects", "cluster": cluster, "project": project, "info": info, "error": error,
               "reserved": namespaces.is_reserved(project.namespace), "retention_days": namespaces.retention().days}
    return _ops_page(request, "quotas/namespace.html", context)


def _act(request: HttpRequest, name: str, slug: str, service, done: str) -> HttpResponse:
    actor = _ops_only(request)
    cluster = _ops_cluster(actor, name)
    project = get_object_or_404(projects_for(actor=actor), slug=slug)
    try:
        service(actor=actor, cluster=cluster, project=project, confirm=_confirm(request))
    except (PortalError, ClusterError) as exc:
        messages.error(request, getattr(exc, "message", str(exc)))
    else:
        messages.success(request, done.format(namespace=project.namespace, cluster=cluster.name))
    return redirect("ops-namespace", cluster.name, project.slug)


@login_required
@require_POST
def namespace_adopt(request: HttpRequest, name: str, slug: str) -> HttpResponse:
    return _act(request, name, slug, namespaces.namespace_adopt,
                "Namespace {namespace} adopted: the next reconcile of {cluster} labels it and writes the project's objects.")


@login_required
@require_POST
def namespace_delete(request: HttpRequest, name: str, slug: str) -> HttpResponse:
    return _act(request, name, slug, namespaces.namespace_release,
                "Namespace {namespace} released: the next reconcile of {cluster} deletes it with everything in it.")
