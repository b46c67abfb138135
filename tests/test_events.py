"""After-commit side effects (``portal/events.py``): a failing handler never undoes the commit nor stops the
others; a rollback runs nothing; ``once`` queues one of equal handlers; and nothing else in the product
calls ``transaction.on_commit`` (everything goes through the one helper)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import transaction

from portal import events
from portal.events import after_commit
from tenants.models import Tenant

ROOT = Path(__file__).resolve().parent.parent
APPS = ("portal", "tenants", "quotas", "workloads", "billing", "maintenance")


def boom(what: str) -> None:
    raise RuntimeError(f"handler broke: {what}")


@pytest.mark.django_db(transaction=True)
def test_a_raising_handler_is_logged_and_neither_the_commit_nor_the_other_handlers_suffer(caplog) -> None:
    ran: list[str] = []
    with transaction.atomic():
        Tenant.objects.create(name="Acme", slug="acme")
        after_commit(ran.append, "first")
        after_commit(boom, "mail server down")
        after_commit(ran.append, "third")
        assert ran == []  # nothing before the commit
    assert ran == ["first", "third"]
    assert Tenant.objects.filter(slug="acme").exists()  # committed, and it stays
    assert "after-commit handler tests.test_events.boom('mail server down') failed" in caplog.text
    assert "handler broke: mail server down" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_rollback_runs_nothing() -> None:
    ran: list[str] = []
    with pytest.raises(ValueError), transaction.atomic():
        Tenant.objects.create(name="Acme", slug="acme")
        after_commit(ran.append, "never")
        raise ValueError("the change fails")
    assert ran == [] and not Tenant.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_it_runs_at_once_and_still_only_logs(caplog) -> None:
    ran: list[str] = []
    after_commit(boom, "now")
    after_commit(ran.append, "now")
    assert ran == ["now"] and "handler broke: now" in caplog.text


@pytest.mark.django_db
def test_once_keeps_one_of_equal_handlers_and_keywords_reach_the_handler(django_capture_on_commit_callbacks) -> None:
    ran: list[tuple] = []

    def record(cluster_id: int, *, why: str = "") -> None:
        ran.append((cluster_id, why))

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        after_commit(record, 1, why="quota", once=True)
        after_commit(record, 1, why="quota", once=True)
        after_commit(record, 2, why="quota", once=True)
        after_commit(record, 1, why="quota")  # without once: queued again
        assert [(h.fn, h.args, h.kwargs) for h in events.pending()] == [
            (record, (1,), {"why": "quota"}), (record, (2,), {"why": "quota"}), (record, (1,), {"why": "quota"})]
    assert len(callbacks) == 3
    assert ran == [(1, "quota"), (2, "quota"), (1, "quota")]


@pytest.mark.django_db
def test_a_raising_handler_under_capture_is_contained(django_capture_on_commit_callbacks, caplog) -> None:
    ran: list[str] = []
    with django_capture_on_commit_callbacks(execute=True):
        after_commit(boom, "captured")
        after_commit(ran.append, "after it")
    assert ran == ["after it"] and "handler broke: captured" in caplog.text


# Nothing else schedules on commit --------------------------------------------------------------------------


def on_commit_uses(source: str) -> list[int]:
    """Lines that call or import ``on_commit`` (``transaction.on_commit(...)``, ``connection.on_commit``,
    ``from django.db.transaction import on_commit``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if ((isinstance(node, ast.Attribute) and node.attr == "on_commit")
                or (isinstance(node, ast.ImportFrom) and any(alias.name == "on_commit" for alias in node.names))
                or (isinstance(node, ast.Name) and node.id == "on_commit")):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_the_finder_finds() -> None:
    assert on_commit_uses("from django.db import transaction\ntransaction.on_commit(lambda: 1, robust=True)") == [2]
    assert on_commit_uses("from django.db.transaction import on_commit\non_commit(f)") == [1, 2]
    assert on_commit_uses("connections['default'].on_commit(f)") == [1]
    assert on_commit_uses("after_commit(f, 1)\n# transaction.on_commit in a comment\n") == []


def test_only_portal_events_calls_on_commit() -> None:
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative == Path("portal/events.py") or "migrations" in path.parts:
                continue
            found += [f"{relative}:{line}" for line in on_commit_uses(path.read_text())]
    assert found == [], "schedule through portal.events.after_commit: " + ", ".join(found)


def test_every_task_queued_by_name_is_registered() -> None:
    """``enqueue("name", ...)`` finds its task by the name it is registered under (``@shared_task(name=...)``
    or module.function): a wrong name would queue messages no worker runs."""
    import re
    from pathlib import Path

    from portal.celery import app

    app.loader.import_default_modules()
    root = Path(__file__).resolve().parent.parent
    named = set()
    for app_dir in ("portal", "tenants", "quotas", "workloads", "billing"):
        for path in (root / app_dir).rglob("*.py"):
            text = path.read_text()
            named |= set(re.findall(r"""enqueue\(\s*["']([\w.]+)["']""", text))
            named |= set(re.findall(r"""\(\s*["']([\w.]+)["'],\s*\(""", text)) if "enqueue_chain" in text else set()
    assert named, "the finder found no enqueue calls"
    assert {"quotas.reconcile_cluster", "workloads.tasks.request_materialize_task"} <= named
    missing = sorted(name for name in named if name not in app.tasks)
    assert missing == [], missing
