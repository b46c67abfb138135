"""Ops pages for the price list. Like every ops page, a 404 for everyone but platform ops. Reads start from
``billing.selectors``; writes go through the services the API uses, whose refusals are shown on the form."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.exceptions import PortalError
from portal.ui import Pager, filtered
from tenants.forms import add_service_error
from tenants.guards import ops_only
from tenants.ui import page

from . import selectors, services
from .filters import PriceFilter
from .forms import PriceForm
from .models import Price

LABELS = {"unit": "Unit", "key": "GPU model / MIG profile", "currency": "Currency",
          "effective_after": "Effective from, at or after", "effective_before": "Effective from, before"}


@login_required
def price_list(request: HttpRequest) -> HttpResponse:
    actor = ops_only(request)
    filterset = filtered(PriceFilter, request, selectors.prices_for(actor=actor), labels=LABELS)
    return page(request, "billing/ops_prices.html", {
        "tab": "prices", "filterset": filterset, "pager": Pager(request, filterset.qs),
        "current": selectors.price_list_at(), "finalised_through": selectors.finalised_through(),
        "currency": selectors.currency(),
    })


def _form_page(request: HttpRequest, price: Price | None) -> HttpResponse:
    actor = ops_only(request)
    form = PriceForm(request.POST or None, price=price, currency=selectors.currency())
    if request.method == "POST" and form.is_valid():
        try:
            if price is None:
                saved = services.price_create(actor=actor, **form.cleaned_data)
            else:
                saved = services.price_update(actor=actor, price=price, **form.cleaned_data)
        except (PortalError, ValidationError) as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Price {saved.unit}{' ' + saved.key if saved.key else ''} "
                                      f"{'added' if price is None else 'saved'}.")
            return redirect("ops-prices")
    return page(request, "billing/ops_price_form.html", {
        "tab": "prices", "form": form, "price": price, "finalised_through": selectors.finalised_through(),
    })


@login_required
def price_new(request: HttpRequest) -> HttpResponse:
    return _form_page(request, None)


@login_required
def price_detail(request: HttpRequest, pk: int) -> HttpResponse:
    actor = ops_only(request)
    return _form_page(request, get_object_or_404(selectors.prices_for(actor=actor), pk=pk))


@login_required
@require_POST
def price_delete(request: HttpRequest, pk: int) -> HttpResponse:
    actor = ops_only(request)
    price = get_object_or_404(selectors.prices_for(actor=actor), pk=pk)
    try:
        services.price_delete(actor=actor, price=price)
    except PortalError as exc:
        messages.error(request, exc.message)
        return redirect("ops-price", pk=pk)
    messages.success(request, "Price removed.")
    return redirect("ops-prices")
