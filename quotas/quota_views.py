"""Quota pages: a tenant's split across its projects (tenant admins), a project's quota and asking for more
(members), and quota requests (mine, the approver's inbox, one request, decide, cancel, bulk)."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal import bulk, extensions
from portal.exceptions import PortalError
from portal.inputs import is_id
from portal.quantities import fmt
from portal.ui import Pager, first_page_asked, filtered
from tenants import selectors as tenancy
from tenants.access import Actor
from tenants.filters import TenantSlugOrName, tenant_search_widget
from tenants.guards import tenant_to_change as _admin_tenant
from tenants.models import Project, Tenant
from tenants.ui import page

from . import selectors, services
from .filters import QuotaFilter, QuotaRequestFilter
from .forms import DecisionForm, ProjectQuotaForm, QuotaRequestForm, target_key
from .models import Flavor, QuotaRequest
from .views import (
    COLOURS,
    GPU_KINDS,
    PALETTE,
    ZERO,
    _error_text,
    _safe_next,
    _show_error,
    _visible_project,
    bar_chart,
    dataset,
)


def _tenant_quotas(request: HttpRequest, actor: Actor, tenant: Tenant, *, form: ProjectQuotaForm | None = None) -> HttpResponse:
    tenant_rows = selectors.tenant_quota_rows(tenant=tenant)
    split: dict[tuple[int, str], dict[str, Decimal]] = defaultdict(lambda: {"assigned": ZERO, "used": ZERO})
    by_project: dict[tuple[int, str], dict[str, Decimal]] = defaultdict(dict)
    # The same query tells when the in-use figures were read (the oldest of the rows' clusters' readings).
    readings: set[Any] = set()
    split_rows = 0
    for row in selectors.project_quota_split(tenant=tenant):
        split_rows += 1
        key = (row["flavor_id"], row["resource"])
        split[key]["assigned"] += row["nominal"]
        split[key]["used"] += row["used"]
        by_project[key][row["project__slug"]] = row["nominal"]
        readings.add(row["flavor__cluster__reconciled_at"])
    summary = []
    for row in tenant_rows:
        s = split[(row.flavor_id, row.resource)]
        summary.append({"row": row, "assigned": s["assigned"], "unassigned": row.nominal - s["assigned"], "used": s["used"]})

    projects = tenancy.tenant_projects_for(actor=actor, tenant=tenant)
    flavors = [s["row"].flavor for s in summary]
    unique_flavors = list({f.pk: f for f in flavors}.values())
    filterset = filtered(QuotaFilter, request, selectors.project_quotas_listed(tenant=tenant),
                         hide=("tenant", "cluster", "flavor", "level"),
                         selects={"project": [(p.slug, p.name) for p in projects],
                                  "flavor_name": [(f.name, f.name) for f in unique_flavors]})
    # Unfiltered, the split above counted every project row, and the first page comes from a kept query.
    pager = Pager(request, filterset.qs, count=None if filterset.is_active else split_rows,
                  first=None if filterset.is_active else lambda: selectors.project_quotas_first(tenant=tenant, projects=projects))
    page_rows = list(pager)
    # What the cluster confirmed, for the tenant's rows and the page's project rows: one query for both.
    checks = selectors.quota_confirmations(tenant_rows + page_rows)
    for s in summary:
        s["check"] = checks[s["row"].pk]
    charted = [s for s in summary if s["row"].flavor.kind in GPU_KINDS and s["row"].resource == s["row"].flavor.primary_resource
               and s["check"]["enforced"]]
    chart = None
    if charted:
        datasets = [
            dataset(p.name, [by_project[(s["row"].flavor_id, s["row"].resource)].get(p.slug, ZERO) for s in charted],
                    PALETTE[i % len(PALETTE)], stack="split")
            for i, p in enumerate(projects)
        ]
        datasets.append(dataset("Unassigned", [max(s["unassigned"], ZERO) for s in charted], COLOURS["unassigned"], stack="split"))
        chart = bar_chart(title=f"How {tenant.name} splits its quota across projects",
                          labels=[f"{s['row'].flavor.name} ({s['row'].resource.removeprefix('nvidia.com/')})" for s in charted],
                          datasets=datasets, stacked=True,
                          notes=[f"tenant quota {fmt(s['row'].nominal)}, in use {fmt(s['used'])}" for s in charted])

    if form is None:
        initial: dict[str, Any] = {}
        edit = request.GET.get("edit")
        if is_id(edit):
            editing = selectors.project_quotas_for(tenant=tenant).filter(pk=int(edit)).first()
            if editing is not None:
                initial = {"project": editing.project.slug, "target": target_key(editing.flavor, editing.resource),
                           "nominal": fmt(editing.nominal),
                           "borrowing_limit": None if editing.borrowing_limit is None else fmt(editing.borrowing_limit),
                           "lending_limit": None if editing.lending_limit is None else fmt(editing.lending_limit)}
        offered = [f for f in unique_flavors if tenant_checks_enforced(summary, f)]
        form = ProjectQuotaForm(projects=[p for p in projects if p.is_active], flavors=offered, initial=initial)
    context = {"tenant": tenant, "tab": "quotas", "summary": summary,
               "chart": chart, "filterset": filterset, "pager": pager, "form": form,
               "project_rows": [(q, checks[q.pk]) for q in page_rows],
               "usage_readings": [{"flavor__cluster__reconciled_at": at} for at in readings],
               "not_enforced": [s for s in summary if not s["check"]["enforced"]],
               "quota_notices": extensions.quota_notices.call(tenant=tenant) or []}
    return page(request, "quotas/tenant_quotas.html", context)


def tenant_checks_enforced(summary: list[dict[str, Any]], flavor: Flavor) -> bool:
    return next((s["check"]["enforced"] for s in summary if s["row"].flavor_id == flavor.pk), False)


@login_required
def tenant_quotas(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    return _tenant_quotas(request, actor, _admin_tenant(actor, slug))


@login_required
@require_POST
def project_quota_set(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    tenant = _admin_tenant(actor, slug)
    projects = tenancy.projects_for(actor=actor).filter(tenant=tenant).order_by("name")
    flavors = selectors.flavors_promised_to(tenant=tenant)
    form = ProjectQuotaForm(request.POST, projects=projects, flavors=flavors)
    if form.is_valid():
        flavor, resource = form.cleaned_target()
        project = form.cleaned_project()
        data = form.cleaned_data
        try:
            row = services.quota_set(actor=actor, project=project, flavor=flavor, resource=resource, nominal=data["nominal"],
                                     borrowing_limit=data["borrowing_limit"], lending_limit=data["lending_limit"])
        except (PortalError, ValidationError) as exc:
            _show_error(form, exc)
        else:
            messages.success(request, f"{project.name} now has {fmt(row.nominal)} × {resource} of {flavor.name}.")
            return redirect("tenant-quotas", slug=tenant.slug)
    return _tenant_quotas(request, actor, tenant, form=form)


def _usage_chart(project: Project, rows: list[dict[str, Any]], flavors: dict[int, Flavor]) -> dict[str, Any] | None:
    shown = [r for r in rows if flavors[r["flavor_id"]].kind in GPU_KINDS and r["resource"] == flavors[r["flavor_id"]].primary_resource
             and r["enforced"]]
    if not shown:
        return None
    return bar_chart(
        title=f"{project.name}: quota in use, borrowed and free",
        labels=[f"{r['flavor']} ({r['resource'].removeprefix('nvidia.com/')})" for r in shown],
        datasets=[
            dataset("In use (own quota)", [max(r["used"] - r["borrowed"], ZERO) for r in shown], COLOURS["used"], stack="q"),
            dataset("Borrowed", [r["borrowed"] for r in shown], COLOURS["borrowed"], stack="q"),
            dataset("Free", [r["free"] for r in shown], COLOURS["free"], stack="q"),
        ],
        stacked=True,
        notes=[f"nominal quota {fmt(r['nominal'])}" for r in shown],
    )


def _listed(requests: QuerySet[QuotaRequest]) -> QuerySet[QuotaRequest]:
    """Quota requests as their cards and table rows read them: their own shown columns, no join (the related rows
    come after the page, ``_shown``)."""
    return selectors.quota_requests_listed(requests)


def _shown(*pages: Any) -> None:
    """Put the related rows the cards, table rows and request lines show on the rows of ``pages`` (Pagers or lists
    of quota requests): one query for them all (``selectors.with_shown_related``)."""
    selectors.with_shown_related([r for rows in pages for r in rows])


def _project_quota(request: HttpRequest, actor: Actor, project: Project, *, form: QuotaRequestForm | None = None) -> HttpResponse:
    tenant = project.tenant
    row_flavors: dict[int, Flavor] = {}
    rows = selectors.project_quota_summary(project=project, flavors=row_flavors)
    requests = _listed(selectors.quota_requests_for(actor=actor)).filter(project=project).order_by("-created_at")
    filterset = filtered(QuotaRequestFilter, request, requests, hide=("tenant", "project", "flavor", "inbox", "approver"))
    # Unfiltered, the first page comes from a kept query, and the count (asked only when more than a page) is kept.
    def kept_count() -> int:
        known = selectors.project_quota_request_count_kept(actor=actor, project=project)
        return filterset.qs.count() if known is None else known

    pager = Pager(request, filterset.qs, first=None if filterset.is_active
                  else lambda: selectors.project_quota_requests_first(actor=actor, project=project),
                  count=None if filterset.is_active else kept_count)
    _shown(pager)
    context = {
        "project": project, "tenant": tenant, "rows": rows, "chart": _usage_chart(project, rows, row_flavors),
        # The enforced flavors from the process's copy (the same for every actor): no query.
        "form": form or QuotaRequestForm(flavors=selectors.enforced_flavors(), initial={"target": request.GET.get("target", "")}),
        "filterset": filterset, "pager": pager,
        "not_enforced": [r for r in rows if not r["enforced"]],
        "drifting": [r for r in rows if r["drift"]],
        "quota_notices": extensions.quota_notices.call(tenant=tenant, project=project) or [],
    }
    return page(request, "quotas/project_quota.html", context)


@login_required
def project_quota(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    return _project_quota(request, actor, _visible_project(actor, slug))


@login_required
@require_POST
def quota_request_create(request: HttpRequest, slug: str) -> HttpResponse:
    actor = Actor.from_request(request)
    project = _visible_project(actor, slug)
    form = QuotaRequestForm(request.POST, flavors=selectors.flavors_for(actor=actor).filter(selectors.enforced_flavor_q()))
    if form.is_valid():
        flavor, resource = form.cleaned_target()
        data = form.cleaned_data
        try:
            created = services.quota_request_create(actor=actor, project=project, flavor=flavor, resource=resource,
                                                    amount=data["amount"], reason=data["reason"], until=data["until"],
                                                    share_memory_gib=data.get("share_memory_gib"),
                                                    share_cores_percent=data.get("share_cores_percent"))
        except (PortalError, ValidationError) as exc:
            _show_error(form, exc)
        else:
            total = f" ({created.share_totals} in all)" if created.is_share else ""
            messages.success(request, f"Request #{created.pk} sent: {created.what}{total}. "
                                      f"It waits for {created.get_approver_display().lower()} approval.")
            return redirect("project-quota", slug=project.slug)
    return _project_quota(request, actor, project, form=form)


def _item_context(item: QuotaRequest, *, error: str | None = None, note: str | None = None,
                  form: DecisionForm | None = None, next_url: str | None = None) -> dict[str, Any]:
    """The card's context; the card asks the predicates who may decide or withdraw (``{% may %}``)."""
    current = selectors.quotas_asked_for([item]).get(item.pk)
    return {"r": item, "current": current, "error": error, "note": note, "form": form, "next_url": next_url}


def _all_requests(request: HttpRequest, actor: Actor) -> dict[str, Any]:
    visible = _listed(selectors.quota_requests_for(actor=actor)).order_by("-created_at")
    filterset = filtered(QuotaRequestFilter, request, visible, hide=("inbox", "flavor"), selects={
        "project": selectors.project_choices_for(actor=actor),
    })
    # Tenants may be thousands: typed (slug or name), with suggestions as one types (the page's datalist).
    filterset.filters["tenant"] = TenantSlugOrName(field_name="project__tenant")
    tenant_search_widget(filterset.form.fields["tenant"], list_id="tenant-options")
    # Unfiltered, the first page comes from a kept query (the same rows), and the count is kept too.
    first = None if filterset.is_active else lambda: selectors.quota_requests_first(actor=actor)
    counts = None if filterset.is_active else selectors.quota_request_counts_kept(actor=actor)
    return {"filterset": filterset, "pager": Pager(request, filterset.qs, first=first,
                                                   count=counts["seen"] if counts else None)}


@login_required
def quota_requests(request: HttpRequest) -> HttpResponse:
    actor = Actor.from_request(request)

    def inbox_qs() -> Any:
        return _listed(selectors.quota_requests_for(actor=actor, inbox=True)).order_by("created_at")

    counts = selectors.quota_request_counts_kept(actor=actor)  # kept: the pagers count nothing
    if request.htmx and request.htmx.target == "all":
        # A decision was made in place on this page (event ``approvals-changed``): the table of every request
        # and the inbox's count follow it; the decided card itself was already replaced.
        context = _all_requests(request, actor) | {"inbox_count": counts["inbox"] if counts else inbox_qs().count(), "oob": True}
        _shown(context["pager"])
        return render(request, "quotas/_request_table.html", context, using="jinja2")
    # The inbox's first page comes from a kept query and its count is kept: the queryset (with the quota now of each
    # request, about 1 ms to build) is built only for a later page or without the kept count.
    rows = [] if counts is not None and first_page_asked(request, "inbox_page") else selectors.with_quota_now(inbox_qs())
    inbox = Pager(request, rows, param="inbox_page", count=counts["inbox"] if counts else None,
                  first=lambda: selectors.quota_requests_first(actor=actor, inbox=True))
    inbox_items = list(inbox)
    table = _all_requests(request, actor)
    _shown(inbox_items, table["pager"])
    context = {"inbox": inbox, "inbox_items": [(r, selectors.quota_now(r)) for r in inbox_items],
               "inbox_count": inbox.page.paginator.count, "bulk_form": DecisionForm(prefix="bulk")}
    return page(request, "quotas/request_list.html", context | table)


def _quota_kind(actor: Actor, decision: str, comment: str) -> bulk.Kind:
    call = services.quota_request_approve if decision == "approve" else services.quota_request_reject
    return bulk.Kind(
        find=lambda pk: selectors.quota_requests_for(actor=actor).filter(pk=pk).first(),
        decide=lambda item: call(actor=actor, request=item, comment=comment),
        describe=lambda item: (item.status, f"#{item.pk}"),
    )


@login_required
@require_POST
def quota_requests_bulk(request: HttpRequest) -> HttpResponse:
    """Approve or reject the ticked quota requests with one comment (required to reject); each through
    ``services.quota_request_approve``/``reject`` in its own transaction, under the same locks and limits as one
    decision: those that no longer fit (or were decided meanwhile) are reported one by one, the others are done."""
    actor = Actor.from_request(request)
    form = DecisionForm(request.POST, prefix="bulk")
    ids = [int(v) for v in request.POST.getlist("quota_requests") if is_id(v)]
    error = ""
    if not form.is_valid():
        error = "Choose Approve selected or Reject selected."
    elif not ids:
        error = "Tick at least one request."
    elif len(ids) > bulk.MAX_ITEMS:
        error = f"At most {bulk.MAX_ITEMS} at once."
    elif form.cleaned_data["decision"] == "reject" and not form.cleaned_data["comment"].strip():
        error = "Say why they are rejected, so the requesters know what to do."
    if error:
        messages.error(request, error)
        return redirect(_safe_next(request, reverse("quota-requests")))
    decision, comment = form.cleaned_data["decision"], form.cleaned_data["comment"].strip()
    outcome = bulk.decide_each(decision=decision, items=[("quota_request", pk) for pk in ids],
                               kinds={"quota_request": _quota_kind(actor, decision, comment)})
    verb = "Approved" if decision == "approve" else "Rejected"
    if outcome.done:
        messages.success(request, f"{verb} {len(outcome.done)}: " + ", ".join(r.label for r in outcome.done) + ".")
    for failed in outcome.failed:
        messages.error(request, f"#{failed.id}: not {verb.lower()}. {failed.error}")
    return redirect(_safe_next(request, reverse("quota-requests")))


def _visible_request(actor: Actor, pk: int) -> QuotaRequest:
    return get_object_or_404(selectors.quota_requests_for(actor=actor), pk=pk)


@login_required
def quota_request_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    item = _visible_request(actor, pk)
    return page(request, "quotas/request_detail.html", _item_context(item) | {"detail": True})


def _answer(request: HttpRequest, actor: Actor, item: QuotaRequest, *, error: str | None, done: str,
            form: DecisionForm | None = None) -> HttpResponse:
    """htmx: the request's card, updated, and the event ``approvals-changed`` after a change (the navigation's
    counts and the list of every request refresh themselves). Plain POST: back where it came from, with a message."""
    if request.htmx:
        item = _visible_request(actor, item.pk)
        back = _safe_next(request, reverse("quota-requests"))
        response = render(request, "quotas/_request_card.html",
                          _item_context(item, error=error, note=None if error else done, form=form, next_url=back),
                          using="jinja2")
        if not error:
            response["HX-Trigger"] = "approvals-changed"
        return response
    if error:
        messages.error(request, error)
    else:
        messages.success(request, done)
    return redirect(_safe_next(request, reverse("quota-requests")))


@login_required
@require_POST
def quota_request_decide(request: HttpRequest, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    item = _visible_request(actor, pk)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _answer(request, actor, item, error="Choose Approve or Reject.", done="", form=form)
    decision, comment = form.cleaned_data["decision"], form.cleaned_data["comment"]
    try:
        if decision == "approve":
            item = services.quota_request_approve(actor=actor, request=item, comment=comment)
            if item.is_share:
                done = (f"Request #{item.pk} approved: {item.project.name} has {fmt(item.amount)} more shares of "
                        f"{item.flavor} · {item.share_size} ({item.share_totals}).")
            else:
                done = (f"Request #{item.pk} approved: {item.project.name} has {fmt(item.amount)} more "
                        f"× {item.resource} of {item.flavor.name}.")
        else:
            item = services.quota_request_reject(actor=actor, request=item, comment=comment)
            done = f"Request #{item.pk} rejected."
    except (PortalError, ValidationError) as exc:
        return _answer(request, actor, item, error=_error_text(exc), done="", form=form)
    return _answer(request, actor, item, error=None, done=done)


@login_required
@require_POST
def quota_request_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    actor = Actor.from_request(request)
    item = _visible_request(actor, pk)
    try:
        item = services.quota_request_cancel(actor=actor, request=item)
    except (PortalError, ValidationError) as exc:
        return _answer(request, actor, item, error=_error_text(exc), done="")
    return _answer(request, actor, item, error=None, done=f"Request #{item.pk} cancelled.")
