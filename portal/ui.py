"""The shared kit for portal pages: pagination and list filters. Every app's views use these; none of
them knows about tenancy (the page frame that does lives in ``tenants.ui``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import django_filters as filters
from django import forms
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest

PAGE_SIZE = 25


class Pager:
    """A page of a list plus the links to its neighbours, keeping the other query parameters (filters)."""

    def __init__(self, request: HttpRequest, queryset: QuerySet[Any], *, param: str = "page", per_page: int = PAGE_SIZE):
        self.request = request
        self.param = param
        self.page: Page = Paginator(queryset, per_page).get_page(request.GET.get(param))

    def __iter__(self):
        return iter(self.page.object_list)

    def __len__(self) -> int:
        return len(self.page.object_list)

    def _url(self, number: int) -> str:
        query = self.request.GET.copy()
        query[self.param] = str(number)
        return "?" + query.urlencode()

    @property
    def first_url(self) -> str | None:
        return self._url(1) if self.page.number > 2 else None

    @property
    def previous_url(self) -> str | None:
        return self._url(self.page.previous_page_number()) if self.page.has_previous() else None

    @property
    def next_url(self) -> str | None:
        return self._url(self.page.next_page_number()) if self.page.has_next() else None

    @property
    def last_url(self) -> str | None:
        last = self.page.paginator.num_pages
        return self._url(last) if self.page.number < last - 1 else None


# Shorter labels than the FilterSets' own (which the API schema uses).
FILTER_LABELS = {
    "tenant": "Tenant",
    "project": "Project",
    "user": "Username",
    "actor": "Who",
    "action": "Action starts with",
    "since": "Since (UTC)",
    "until": "Until (UTC)",
    "is_active": "Account active",
}


def filtered(
    filterset_class: type[filters.FilterSet],
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    hide: tuple[str, ...] = (),
    selects: dict[str, list[tuple[str, str]]] | None = None,
    labels: Mapping[str, str] | None = None,
) -> filters.FilterSet:
    """A bound FilterSet for a list page. ``hide`` drops filters the page fixes itself (the tenant
    on a tenant's page); ``selects`` turns slug text filters into drop-downs of known values;
    ``labels`` are the page's own short labels, over ``FILTER_LABELS``. Every "no filter" choice reads "Any"."""
    filterset = filterset_class(request.GET or None, queryset=queryset, request=request)
    form = filterset.form
    labels = FILTER_LABELS | dict(labels or {})
    for name in hide:
        form.fields.pop(name, None)
    for name, field in form.fields.items():
        field.label = labels.get(name, field.label)
        if isinstance(field.widget, forms.NullBooleanSelect):
            field.widget.choices = [(value, "Any" if value == "unknown" else label) for value, label in field.widget.choices]
        elif getattr(field, "empty_label", None) is not None:
            # django-filter's choice fields put their own empty choice ("---------") in front of
            # whatever ``choices`` holds: relabel that one and keep it out of the list, or there are two.
            field.empty_label = "Any"
            field.choices = [(value, label) for value, label in field.choices if value != ""]
        elif hasattr(field, "choices"):
            field.choices = [(value, "Any" if value == "" else label) for value, label in field.choices]
    for name, choices in (selects or {}).items():
        if name in form.fields:
            form.fields[name].widget = forms.Select(choices=[("", "Any")] + choices)
    for name in ("since", "until"):
        if name in form.fields:
            form.fields[name].widget = forms.DateTimeInput(attrs={"type": "datetime-local"})
    filterset.is_active = any(request.GET.get(name) for name in form.fields)
    return filterset
