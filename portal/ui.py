"""The shared kit for portal pages: pagination and list filters. Every app's views use these; none of
them knows about tenancy (the page frame that does lives in ``tenants.ui``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import django_filters as filters
from django import forms
from django.core.paginator import Page, Paginator
from django.utils.functional import cached_property
from django.db.models import Count, QuerySet, Window
from django.http import HttpRequest

PAGE_SIZE = 25


class BoundedPaginator(Paginator):
    """A ``Paginator`` that counts at most ``bound`` rows (``SELECT COUNT(*) FROM (… LIMIT bound + 1)``): a list
    that grows with history (every request of a user) costs the same to count at any size. ``capped`` says the
    count stopped there (more follow, the pagination shows "1,000+" and no last page)."""

    def __init__(self, object_list: Any, per_page: int, *, bound: int):
        super().__init__(object_list, per_page)
        self.bound = bound
        self.capped = False

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return len(rows)
        found = rows.order_by().values("pk")[:self.bound + 1].count()
        self.capped = found > self.bound
        return found


class CountedBy(Paginator):
    """A ``Paginator`` whose count is ``counter()`` (a count kept elsewhere), asked only when the pagination shows it:
    a page that comes back short, or a first page whose next page is never counted, costs nothing."""

    def __init__(self, object_list: Any, per_page: int, *, counter: Callable[[], int]):
        super().__init__(object_list, per_page)
        self._counter = counter

    @cached_property
    def count(self) -> int:
        return self._counter()


def first_page_asked(request: HttpRequest, param: str = "page") -> bool:
    """Whether the request asks for the first page of the list paged by ``param``: none, 1, or a value that is not a
    number (``page_of`` reads those as the first page)."""
    try:
        return int(request.GET.get(param) or 1) <= 1
    except (TypeError, ValueError):
        return True


def page_of(queryset: QuerySet[Any] | list[Any], per_page: int, number: Any, *,
            count: int | Callable[[], int] | None = None,
            window: bool = False, most: int | None = None, first: Callable[[], list[Any]] | None = None) -> Page:
    """``Paginator(queryset, per_page).get_page(number)``, counting only when it must.

    The page is read with one row more than it shows: a page that comes back short tells the total
    without a ``COUNT(*)`` (a short list, or the last page: one query instead of two). A full page
    counts when the pagination asks how many there are, unless the caller knows (``count``) or asks for
    ``window``: the page's rows then carry the total (``COUNT(*) OVER ()``). That suits lists bounded by what
    they belong to (a project's members or tokens), never a history that grows, where the database would read
    every row to count them instead of stopping at the page. ``count`` may be a function (a kept count): called only
    when the pagination asks (``CountedBy``). A number past the end falls back to Django's own
    (the last page). ``most``: count at most that many rows past the page's start (``BoundedPaginator``).
    ``first``: reads the first page's rows (its first ``per_page + 1`` rows, as the queryset would) by a cheaper
    way than the queryset (a kept query, ``portal.compiled``); called only for the first page, the queryset then
    only counted when the pagination asks. With ``window``, ``first``'s rows carry the total (``_pager_total``) as
    the queryset's would."""
    try:
        wanted = int(number)
    except (TypeError, ValueError):
        wanted = 1
    wanted = max(wanted, 1)
    start = (wanted - 1) * per_page
    if callable(count):
        paginator: Paginator = CountedBy(queryset, per_page, counter=count)
    elif most is not None and count is None and not window:
        paginator = BoundedPaginator(queryset, per_page, bound=start + most)
    else:
        paginator = Paginator(queryset, per_page)
    if count is not None and not callable(count):
        paginator.count = count
    counted = window and count is None and isinstance(queryset, QuerySet) and not queryset.query.distinct
    if first is not None and start == 0:
        rows = first()
    else:
        if counted:
            queryset = queryset.annotate(_pager_total=Window(Count("pk")))
        rows = list(queryset[start:start + per_page + 1])
    if len(rows) > per_page:
        if counted:
            paginator.count = rows[0]._pager_total
        return Page(rows[:per_page], wanted, paginator)  # more follow: the count is asked for when shown
    if rows or wanted == 1:
        paginator.count = start + len(rows)  # a cached_property: known now, never queried
        return Page(rows, wanted, paginator)
    return paginator.get_page(number)


class Pager:
    """A page of a list plus the links to its neighbours, keeping the other query parameters (filters)."""

    def __init__(self, request: HttpRequest, queryset: QuerySet[Any] | list[Any], *, param: str = "page",
                 per_page: int = PAGE_SIZE, count: int | Callable[[], int] | None = None, window: bool = False,
                 most: int | None = None,
                 first: Callable[[], list[Any]] | None = None):
        self.request = request
        self.param = param
        self.page: Page = page_of(queryset, per_page, request.GET.get(param), count=count, window=window, most=most,
                                  first=first)

    @property
    def capped(self) -> bool:
        """Whether the count stopped at its bound (``most``): more rows follow than it says."""
        paginator = self.page.paginator
        return bool(getattr(paginator, "bound", None) is not None and paginator.count and paginator.capped)

    @property
    def counted(self) -> str:
        """The count as the pagination shows it: ``"1,000+"`` when it stopped at its bound, else the number."""
        paginator = self.page.paginator
        return f"{paginator.bound:,}+" if self.capped else str(paginator.count)

    @property
    def pages(self) -> str:
        """The number of pages as the pagination shows it: those the bound fills then ``+`` when the count stopped
        at it, else the number."""
        paginator = self.page.paginator
        if self.capped:
            return f"{-(-paginator.bound // paginator.per_page):,}+"
        return str(paginator.num_pages)

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
        if self.capped:
            return None  # where the list ends is not known
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


_WITHOUT: dict[tuple[type[filters.FilterSet], tuple[str, ...]], type[filters.FilterSet]] = {}


def _without(filterset_class: type[filters.FilterSet], hide: tuple[str, ...]) -> type[filters.FilterSet]:
    """``filterset_class`` less the filters named in ``hide`` (made once per class and names): a page that fixes them
    neither copies those filters nor builds their form fields, which took most of a list page's filter form (the
    approvals inbox hides 10 of the request filter's 15). A hidden filter filtered nothing before either: it had no
    form field, so no cleaned value."""
    hidden = tuple(name for name in hide if name in filterset_class.base_filters)
    if not hidden:
        return filterset_class
    key = (filterset_class, hidden)
    made = _WITHOUT.get(key)
    if made is None:
        made = type(filterset_class.__name__, (filterset_class,), {"__module__": filterset_class.__module__})
        made.base_filters = {name: f for name, f in filterset_class.base_filters.items() if name not in hidden}
        made = _WITHOUT.setdefault(key, made)
    return made


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
    filterset = _without(filterset_class, hide)(request.GET or None, queryset=queryset, request=request)
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
