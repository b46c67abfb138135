"""The one state-machine skeleton: every status or state column that moves goes through a :class:`Machine`.

An app declares its machine in its ``states.py`` (or ``<name>_states.py`` when it has two) with the model, the
column, the table of allowed moves, the final states, the timestamps each target sets, how its audit entries
are named and what happens on every move; the module keeps thin functions (``move``, ``can_move``...) for its
callers. docs/architecture.md ("State machines") shows a declaration.

``Machine.move`` is a compare-and-set under the row's lock, in one transaction: it locks the row if it is still
in a state that may move to the target (None otherwise: another worker or a decider got there first, nothing is
written), UPDATEs it filtered on the state it read, runs the caller's ``effect`` and the machine's ``effects``
under the lock, and writes one audit entry with the row before and after. ``move_many`` is the same for a batch
(one lock in pk order, one UPDATE; the caller writes the batch's records in ``then``).

portal sits below every app, so the audit writer is given by the declaration (``record=tenants.audit.audit_record``)
and actors are whatever that writer takes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import models, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

NOW = object()  # in ``stamps`` / ``every``: the time of the move


@dataclass
class Move:
    """What a machine's ``effects`` are told about one move: the row (locked, already updated), the state it left,
    the target, who moved it, the reason and the caller's ``context`` (e.g. a timeline message)."""

    obj: Any
    source: str
    to: str
    actor: Any
    reason: str = ""
    context: dict[str, Any] = field(default_factory=dict)


class Machine:
    """One state column's lifecycle. See the module's docstring; arguments:

    ``allowed``: state -> the states it may move to. ``final``: nothing more happens by itself.
    ``stamps``: target (a state, or a collection of states such as ``final``) -> columns set by a move there
    (``NOW``: the move's time); a state's own entry wins over a collection's. ``every``: columns every move sets.
    ``reason_field``: the column a move's reason goes to (cut to ``reason_length``).
    ``audit_as``: entries are ``<audit_as>.<target>`` unless the caller names the ``action``.
    ``record``: the audit writer (keyword arguments actor, action, target, tenant, project, before, after).
    ``scope(obj) -> (tenant, project)`` of the audit entry. ``describe(obj)``: further keys of the entry's "after".
    ``snapshot(obj)``: the entry's before and after instead of ``{column: state}`` (the caller may give its own).
    ``reload``: lock and read the whole row (``related``: its select_related), and read it again after the effects
    (machines whose effects write elsewhere, or whose callers want the row back); without it only the state is
    read under the lock and the caller's instance stands for the row.
    ``effects``: ``fn(Move)`` run on every move, under the lock, after the caller's ``effect``.
    """

    def __init__(
        self, model: type[models.Model], *, field: str = "status", allowed: Mapping[str, Collection[str]],
        final: Collection[str] = frozenset(), audit_as: str, record: Callable[..., Any],
        stamps: Mapping[Any, Mapping[str, Any]] | None = None, every: Mapping[str, Any] | None = None,
        reason_field: str | None = None, reason_length: int = 500,
        scope: Callable[[Any], tuple[Any, Any]] = lambda obj: (None, None),
        describe: Callable[[Any], dict[str, Any]] | None = None,
        snapshot: Callable[[Any], dict[str, Any]] | None = None,
        related: tuple[str, ...] = (), reload: bool = False,
        effects: Iterable[Callable[[Move], None]] = (),
    ) -> None:
        self.model, self.field = model, field
        self.states = frozenset(str(c) for c, _ in model._meta.get_field(field).choices)
        unknown = ({*allowed} | {t for ts in allowed.values() for t in ts} | set(final)) - self.states
        if unknown:
            raise ValueError(f"{model.__name__}.{field} has no state {sorted(unknown)}")
        self.allowed = {str(s): frozenset(str(t) for t in ts) for s, ts in allowed.items()}
        self.final = frozenset(final)
        self.audit_as, self.record = audit_as, record
        self.stamps, self.every = dict(stamps or {}), dict(every or {})
        self.reason_field, self.reason_length = reason_field, reason_length
        self.scope, self.describe, self.snapshot = scope, describe, snapshot
        self.related, self.reload = related, reload
        self.effects = tuple(effects)

    # ------------------------------------------------------------------------------------------- the table
    def can_move(self, current: str, to: str) -> bool:
        return to in self.allowed.get(current, ())

    def sources_of(self, to: str, only_from: Iterable[str] | None = None) -> list[str]:
        """The states from which ``to`` may be reached (narrowed to ``only_from``)."""
        keep = None if only_from is None else set(only_from)
        return sorted(s for s, targets in self.allowed.items() if to in targets and (keep is None or s in keep))

    def _sources(self, to: str, only_from: Iterable[str] | None) -> list[str]:
        if to not in self.states:
            raise ValueError(f"Unknown {self.model._meta.verbose_name} {self.field} {to!r}.")
        sources = self.sources_of(to, only_from)
        if not sources:
            raise ValueError(f"No {self.field} may move to {to!r}"
                             + (f" from {sorted(only_from)}." if only_from is not None else "."))
        return sources

    def values(self, to: str, *, reason: str = "", fields: Mapping[str, Any] | None = None, now: Any = None) -> dict[str, Any]:
        """The columns a move to ``to`` writes: the state, the reason, ``every``, the target's stamps, ``fields``."""
        now = now or timezone.now()
        stamps: Mapping[str, Any] = self.stamps.get(to) or next(
            (v for k, v in self.stamps.items() if not isinstance(k, str) and to in k), {})
        values: dict[str, Any] = {self.field: to}
        if self.reason_field:
            values[self.reason_field] = reason[: self.reason_length]
        values.update({k: now if v is NOW else v for k, v in {**self.every, **stamps}.items()})
        values.update(fields or {})
        return values

    def current(self, pk: Any) -> str | None:
        return self.model.objects.filter(pk=pk).values_list(self.field, flat=True).first()

    # ------------------------------------------------------------------------------------------- moves
    def move(
        self, obj: Any, *, to: str, actor: Any, action: str | None = None, reason: str = "",
        fields: Mapping[str, Any] | None = None, where: Mapping[str, Any] | None = None,
        only_from: Iterable[str] | None = None, effect: Callable[[Any], None] | None = None,
        snapshot: Callable[[Any], dict[str, Any]] | None = None, detail: Mapping[str, Any] | None = None,
        context: Mapping[str, Any] | None = None, now: Any = None,
    ) -> Any | None:
        """Compare-and-set ``obj`` (by pk) to ``to``. None when it is no longer in a state that may move there
        (nothing written). Otherwise the row: with ``reload`` the row read under the lock and read again after the
        effects (``obj`` is left as it was), else ``obj`` itself, holding the written values. ``fields``: further
        columns of the same UPDATE; ``where``: further conditions of the compare; ``effect(row)``: the caller's
        writes under the lock (raising rolls everything back); ``detail``: further keys of the audit's "after";
        ``context``: what the machine's ``effects`` are told besides (``Move.context``); ``now``: the move's time."""
        sources = self._sources(to, only_from)
        values = self.values(to, reason=reason, fields=fields, now=now)
        snap = snapshot or self.snapshot
        with transaction.atomic():
            query = (self.model.objects.select_for_update(of=("self",))
                     .filter(pk=obj.pk, **{f"{self.field}__in": sources}, **(where or {})))
            if self.reload:  # the row itself, read under the lock, is what the effect and the audit see
                row = query.select_related(*self.related).first()
                source = None if row is None else getattr(row, self.field)
            else:  # the caller's instance is the row: only its state is read
                row, source = obj, query.values_list(self.field, flat=True).first()
            if source is None:
                return None
            before = snap(row) if snap else {self.field: source}
            won = self.model.objects.filter(pk=obj.pk, **{self.field: source}).update(**values) == 1
            if not won:  # pragma: no cover - the lock above makes this unreachable on PostgreSQL
                return None
            for name, value in values.items():
                setattr(row, name, value)
            if effect is not None:
                effect(row)
            for hook in self.effects:
                hook(Move(row, source, to, actor, reason, dict(context or {})))
            if self.reload:
                row = self.model.objects.select_related(*self.related).get(pk=obj.pk)
            if snap:
                after = snap(row)
            else:
                after = {self.field: to, **(self.describe(row) if self.describe else {}), **(detail or {})}
                if reason:
                    after["reason"] = reason[:500]
            tenant, project = self.scope(row)
            self.record(actor=actor, action=action or f"{self.audit_as}.{to}", target=row, tenant=tenant,
                        project=project, before=before, after=after)
        return row

    def move_many(
        self, objs: list[Any], *, to: str, reason: str = "", fields: Mapping[str, Any] | None = None,
        fields_each: Mapping[Any, Mapping[str, Any]] | None = None, only_from: Iterable[str] | None = None,
        then: Callable[[list[tuple[Any, str]]], None] | None = None, now: Any = None,
    ) -> list[Any]:
        """``move()`` for a batch: the rows still in a source state are locked (in pk order: two batches never
        deadlock) and moved by one UPDATE; ``fields_each`` (pk -> columns) differ by row. ``then([(obj, source)])``
        writes the batch's records (timeline, audit) in the same transaction. Returns the objects that moved,
        holding the written values; nothing is written for the others."""
        if not objs:
            return []
        sources = self._sources(to, only_from)
        values = self.values(to, reason=reason, fields=fields, now=now)
        each = fields_each or {}
        by_pk = {o.pk: o for o in objs}
        with transaction.atomic():
            current = dict(self.model.objects.select_for_update(of=("self",))
                           .filter(pk__in=list(by_pk), **{f"{self.field}__in": sources})
                           .order_by("pk").values_list("pk", self.field))
            if not current:
                return []
            update = dict(values)
            for name in {n for row in each.values() for n in row}:
                whens = [When(pk=pk, then=Value(row[name])) for pk, row in each.items() if pk in current and name in row]
                update[name] = Case(*whens, default=F(name))
            self.model.objects.filter(pk__in=list(current), **{f"{self.field}__in": sources}).update(**update)
            moved = [by_pk[pk] for pk in current]
            if then is not None:
                then([(o, current[o.pk]) for o in moved])
        for obj in moved:
            for name, value in {**values, **each.get(obj.pk, {})}.items():
                setattr(obj, name, value)
        return moved
