"""Extension points: how a lower app asks a higher one for something without importing it.

Apps import only downward (``portal`` ← ``tenants`` ← ``quotas`` ← ``workloads`` ← ``billing``). When a
lower app needs an answer only a higher one has (workloads showing a cost that billing's price list
knows), the kit holds a :class:`Slot`: the higher app registers a function in its ``AppConfig.ready()``,
the lower one calls the slot, and gets None while nothing is registered.

Every slot declares what a failure of its function means (``policy``, listed in docs/extending.md):

- ``ADVISORY`` (estimates, the meter, "what remains"): the failure is logged and the slot answers None, so an
  estimate never breaks a page or an API call.
- ``ENFORCING`` (``submission_guard``): the answer decides whether something may happen, and None would mean
  "go ahead". The failure is logged and the slot raises :class:`ExtensionUnavailable` (503 from the API, a form
  error on the page) with the slot's ``unavailable`` sentence: it fails closed.

``cost_estimator``: ``register(fn, currency="EUR")`` where ``fn(request_like) -> Decimal | None``;
``request_like`` is a ``WorkloadRequest`` or anything with the same attributes (``tenant``, ``project``,
``template``, ``flavor``, ``gpus``, ``replicas``, ``cpu``, ``memory_gib``, ``duration_hours``, ``priority``;
any of them may be None on a half-filled form). ``estimate(request_like)`` is the amount rounded to the
cent, ``display(request_like)`` the same with its currency ("12.50 EUR").

``cost_so_far``: ``register(fn, currency="EUR")`` where ``fn(request) -> Decimal | None`` is what a request's
usage cost until now (closed usage intervals plus open ones up to now); ``estimate``/``display`` as above.

``usage_meter``: ``register(fn)`` where ``fn(*, cluster, seen, complete)`` is told what the status follower saw
in one cycle: ``seen`` is a list of ``(kind key, event type, object, request id)`` (kind keys as in
``workloads.status.FOLLOWED``; event type ``ADDED``/``MODIFIED``/``DELETED``, or ``LISTED`` on a resync) and
``complete`` is True when ``seen`` is everything the cluster holds (a resync). Billing opens and closes usage
intervals from it; a failure is logged and never stops the follower.

``submission_guard``: ``register(fn)`` where ``fn(project) -> str | None`` says why a new request in ``project``
is refused (a spent budget that refuses), or None. ``workloads.services`` calls it once per submission; it
must be cheap when nothing refuses (billing answers from a cached flag, no query).

``budget_remaining``: ``register(fn)`` where ``fn(request_like) -> str | None`` is what remains of the
request's project (and tenant) budget this month, as a sentence for the request form; None without a budget.

``reserved_name``: ``register(fn)`` where ``fn(name) -> bool`` says whether ``name`` (a new project's slug) is a
namespace the platform keeps for itself (Kubernetes, GPU operator, Kueue...). ``namespace_check``:
``register(fn)`` where ``fn(namespace, *, project_slug=None) -> str | None`` says why a new project may not have
``namespace`` (it exists on a cluster without our labels), or None. tenants asks both when a project is
created; quotas, which knows the clusters, answers. Both are enforcing: a check that fails refuses the project
(a field error on ``slug``) rather than letting it take a namespace nobody checked.

``quota_notices``: ``register(fn)`` where ``fn(*, tenant, project=None) -> list[str]`` are sentences for a quota
page about changes to that tenant's (or project's) quota coming from elsewhere: a MIG change that will cut, or
recently cut, it (maintenance).

``measured_idle_share``: ``register(fn)`` where ``fn(tenant, start, end) -> dict | None`` is the tenant's measured
idle GPU-hours, allocated GPU-hours and idle share (%) over the period, or None without measured samples: the
statement page shows it as information (insights answers; the charges do not change).

``gpus_in_use_by_node``: ``register(fn)`` where ``fn(cluster) -> dict[str, Decimal]`` is how many whole GPUs the
work admitted on ``cluster`` holds on each node (by node name), as far as the portal knows where it runs (Kueue's
topology assignment). The capacity page's per-rack free GPUs subtract it (workloads answers).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from .exceptions import ExtensionUnavailable
from .quantities import format_money, round_money

logger = logging.getLogger(__name__)

ADVISORY = "advisory"  # a failure answers None
ENFORCING = "enforcing"  # a failure refuses (raises ExtensionUnavailable)


class Slot:
    """One function a higher app provides; calling the slot answers None while none is registered. ``policy``
    says what a failure of the function means (see the module's docstring)."""

    def __init__(self, name: str, *, policy: str = ADVISORY, unavailable: str = "", field: str | None = None):
        if policy not in (ADVISORY, ENFORCING):
            raise ValueError(f"unknown failure policy {policy!r}")
        if policy == ENFORCING and not unavailable:
            raise ValueError("an enforcing slot says what its refusal tells the user (unavailable=...)")
        self.name = name
        self.policy = policy
        self.unavailable = unavailable
        self.field = field
        self._fn: Callable[..., Any] | None = None

    @property
    def active(self) -> bool:
        return self._fn is not None

    @property
    def provider(self) -> Callable[..., Any] | None:
        """The registered function, or None (docs/extending.md names it; tests/test_extending_doc.py checks)."""
        return self._fn

    def register(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Provide ``fn`` (replacing the one before). Returns ``fn``, so it works as a decorator."""
        self._fn = fn
        return fn

    def unregister(self) -> None:
        self._fn = None

    @contextmanager
    def registered(self, fn: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
        """``fn`` for the duration of a ``with`` block (tests), then whatever was there before."""
        previous = self._fn
        self.register(fn)
        try:
            yield fn
        finally:
            self._fn = previous

    def call(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn
        if fn is None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if self.policy == ENFORCING:
                logger.exception("the %s extension failed; refusing", self.name)
                raise ExtensionUnavailable(self.unavailable, field=self.field) from exc
            logger.exception("the %s extension failed; answering None", self.name)
            return None


class CostEstimator(Slot):
    """What a request would cost, from the price list of whoever registered (billing)."""

    def __init__(self, name: str = "cost estimate") -> None:
        super().__init__(name)
        self.currency = ""

    def register(self, fn: Callable[[Any], Decimal | None], *, currency: str = "EUR") -> Callable[[Any], Decimal | None]:
        self.currency = currency
        return super().register(fn)

    def unregister(self) -> None:
        super().unregister()
        self.currency = ""

    @contextmanager
    def registered(self, fn: Callable[[Any], Decimal | None], *, currency: str = "EUR") -> Iterator[Callable[..., Any]]:
        previous = (self._fn, self.currency)
        self.register(fn, currency=currency)
        try:
            yield fn
        finally:
            self._fn, self.currency = previous

    def estimate(self, request_like: Any) -> Decimal | None:
        """The estimated cost, rounded to the cent; None when no estimator is registered or it has no answer."""
        value = self.call(request_like)
        if value is None:
            return None
        try:
            return round_money(value)
        except Exception:
            logger.exception("the cost estimate %r is not an amount; answering None", value)
            return None

    def display(self, request_like: Any) -> str | None:
        """The estimate with its currency ("12.50 EUR"), or None."""
        value = self.estimate(request_like)
        return None if value is None else format_money(value, self.currency)


cost_estimator = CostEstimator()
cost_so_far = CostEstimator("cost so far")
usage_meter = Slot("usage meter")
submission_guard = Slot(
    "submission guard", policy=ENFORCING, field="project",
    unavailable="Budget check unavailable: the project's budget could not be checked, so the request was not "
                "submitted. Try again in a few minutes; if it persists, tell platform ops.")
budget_remaining = Slot("budget remaining")
rightsizing = Slot("rightsizing")  # a request -> its measured rightsizing suggestion (insights) or None
measured_idle_share = Slot("measured idle share")  # (tenant, start, end) -> its measured idle share (insights)
quota_notices = Slot("quota notices")
gpus_in_use_by_node = Slot("GPUs in use by node")
reserved_name = Slot(
    "reserved name check", policy=ENFORCING, field="slug",
    unavailable="Namespace check unavailable: whether this slug is a reserved namespace could not be checked, so "
                "the project was not created. Try again in a few minutes; if it persists, tell platform ops.")
namespace_check = Slot(
    "namespace check", policy=ENFORCING, field="slug",
    unavailable="Namespace check unavailable: the clusters could not be asked whether this project's namespace is "
                "free, so the project was not created. Try again in a few minutes; if it persists, tell platform ops.")
