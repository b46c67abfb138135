"""Deciding many items at once through the one-item path (shared by the apps' inboxes).

``decide_each`` calls an app's single-item service for every item, each in the service's own transaction,
so the checks, locks and notifications are those of one click. A refusal (``PortalError`` or a Django
``ValidationError``) is recorded for that item and the others go ahead; an item the actor cannot see is
"not found", as a 404 would say. See workloads/approvals.py and quotas/views.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError

from portal.exceptions import PortalError

MAX_ITEMS = 100


@dataclass
class ItemResult:
    """What became of one item."""

    kind: str
    id: int
    ok: bool
    status: str = ""  # its state or status afterwards, when it could be read
    label: str = ""  # how people name it ("acme-vision/llm-api", "quota request #4")
    error: str = ""
    field: str | None = None
    code: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "id": self.id, "ok": self.ok, "status": self.status,
                               "label": self.label}
        if not self.ok:
            out["error"] = {"code": self.code or "error", "message": self.error, "field": self.field}
        return out


@dataclass
class BulkOutcome:
    decision: str
    results: list[ItemResult] = field(default_factory=list)

    @property
    def done(self) -> list[ItemResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> list[ItemResult]:
        return [r for r in self.results if not r.ok]


def error_parts(exc: PortalError | ValidationError) -> tuple[str, str | None, str]:
    """(message, field, code) of a service's refusal."""
    if isinstance(exc, PortalError):
        return exc.message, exc.field, exc.code
    key = next(iter(exc.error_dict), None) if hasattr(exc, "error_dict") else None
    return " ".join(exc.messages), key, "invalid"


@dataclass(frozen=True)
class Kind:
    """How to find (scoped to the actor: None when not visible), decide and describe one kind of item."""

    find: Callable[[int], Any]
    decide: Callable[[Any], Any]
    describe: Callable[[Any], tuple[str, str]]  # item -> (status, label)


def decide_each(*, decision: str, items: Iterable[tuple[str, int]], kinds: dict[str, Kind]) -> BulkOutcome:
    """Decide every ``(kind, id)`` (duplicates once, in the order given) with ``kinds[kind].decide``."""
    outcome = BulkOutcome(decision=decision)
    seen: set[tuple[str, int]] = set()
    for kind, pk in items:
        if (kind, pk) in seen:
            continue
        seen.add((kind, pk))
        how = kinds[kind]
        item = how.find(pk)
        if item is None:
            outcome.results.append(ItemResult(kind, pk, False, error="Not found.", code="not_found"))
            continue
        try:
            done = how.decide(item)
        except (PortalError, ValidationError) as exc:
            message, key, code = error_parts(exc)
            status, label = how.describe(how.find(pk) or item)
            outcome.results.append(ItemResult(kind, pk, False, status=status, label=label, error=message, field=key,
                                              code=code))
        else:
            status, label = how.describe(done)
            outcome.results.append(ItemResult(kind, pk, True, status=status, label=label))
    return outcome
