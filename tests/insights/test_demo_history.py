"""``manage.py seed_demo`` writes three weeks of history: past requests in final states with their timelines
(some preempted and requeued), 5-minute queue and pool samples (pending work, borrowing, guarantee violations, a MIG
shape mismatch) and priced usage intervals; all of it marked, fast, and written once however often it runs.

The sandbox is not started here: the seed falls back to the demo profile's flavors (quotas/demo.py)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db.models import F, Min
from django.utils import timezone

from billing.models import Price, UsageInterval
from insights.demo import (GANG_RESTART_REASON, HISTORY_DAYS, PREEMPT_REASON, RUN_KEY_PREFIX, SLOT, SWITCH_FINGERPRINT,
                           seeded_counts)
from insights.models import PoolSample, QueueSample
from quotas.models import ArchitectureChange, Flavor
from workloads.models import Reclaim, RequestEvent, RequestState, WorkloadRequest

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(180)]
S = RequestState


@pytest.fixture
def seeded(settings, tmp_path):
    settings.KUBECONFIG = str(tmp_path / "no-sandbox.kubeconfig")
    call_command("seed_demo", stdout=io.StringIO())


def test_seed_writes_three_weeks_of_marked_history(seeded) -> None:
    counts = seeded_counts()
    assert 150 <= counts["requests"] <= 800, counts
    history = WorkloadRequest.objects.filter(seeded=True)
    assert set(history.values_list("state", flat=True)) <= {S.SUCCEEDED, S.FAILED, S.STOPPED}
    assert not history.filter(admitted_at__isnull=True).exists()
    assert not history.filter(admitted_at__lt=F("approved_at")).exists()
    assert not history.filter(finished_at__gt=timezone.now()).exists()
    oldest = history.aggregate(first=Min("created_at"))["first"]
    assert timezone.now() - timedelta(days=HISTORY_DAYS + 1) <= oldest <= timezone.now() - timedelta(days=HISTORY_DAYS - 2)
    # Every demo tenant and the MIG flavors have history; some waits are long.
    assert set(history.values_list("tenant__slug", flat=True)) == {"acme", "globex"}
    assert history.filter(flavor__kind=Flavor.Kind.MIG).exists()
    waits = sorted((r.admitted_at - r.approved_at).total_seconds() for r in history.exclude(events__to_state=S.PREEMPTED))
    assert waits[-1] > 3600 and waits[len(waits) // 2] < 600  # most are admitted at once, some wait for hours
    # Preempted, then requeued, with the reason on the timeline.
    preempted = RequestEvent.objects.filter(request__seeded=True, to_state=S.PREEMPTED)
    assert preempted.count() >= 5
    reasons = set(preempted.values_list("message", flat=True))
    assert PREEMPT_REASON in reasons and GANG_RESTART_REASON in reasons  # Volcano gangs since the switch to E
    reclaims = {m for m in reasons if "due to reclamation within the cohort" in m}
    assert reclaims and reasons - reclaims <= {PREEMPT_REASON, GANG_RESTART_REASON}
    # each reclaim names its lender's Workload UID, and a Reclaim row links the two requests
    for reclaim in Reclaim.objects.filter(seeded=True).select_related("borrower", "lender"):
        assert reclaim.lender.workload_uid == reclaim.preemptor_uid
        assert reclaim.borrower.events.filter(message__contains=f"(UID: {reclaim.preemptor_uid}, ").exists()
        assert reclaim.lender_queued_at < reclaim.evicted_at < reclaim.lender_admitted_at
        assert reclaim.lender.project != reclaim.borrower.project and reclaim.lender.tenant == reclaim.borrower.tenant
    assert Reclaim.objects.filter(seeded=True).count() == len(reclaims) > 0
    switch = ArchitectureChange.objects.get(fingerprint=SWITCH_FINGERPRINT)
    # The live configuration and the last change agree: F until the switch, E (the demo's H100 zone) since.
    assert (switch.from_architecture, switch.to_architecture, switch.state) == ("F", "E", "applied")
    assert switch.cluster.architecture == "E"
    offline = history.filter(flavor__name="h100-80gb-offline")
    gangs = RequestEvent.objects.filter(request__in=offline, message__startswith="Volcano scheduled the gang")
    kueue = RequestEvent.objects.filter(request__in=offline, message__startswith="Admitted by Kueue")
    assert gangs.exists() and kueue.exists()
    assert not gangs.filter(request__approved_at__lt=switch.finished_at).exists()  # Kueue admitted them under F
    assert not kueue.filter(request__approved_at__gte=switch.finished_at).exists()  # Volcano's since
    assert not gangs.exclude(request__template__kind="training").exists()
    # Volcano's pool takes no notebooks: after the switch they ran on the online H100s (Kueue's under E)
    assert not offline.filter(approved_at__gte=switch.finished_at, template__kind="notebook").exists()
    assert not Reclaim.objects.filter(seeded=True, lender__flavor__name="h100-80gb-offline",
                                      evicted_at__gte=switch.finished_at).exists()  # no Kueue reclaim in Volcano's pool
    assert RequestEvent.objects.filter(request__seeded=True, from_state=S.PREEMPTED, to_state=S.QUEUED).count() == preempted.count()
    # The timeline is in the past, in order: submitted first, the final state last.
    req = history.filter(events__to_state=S.PREEMPTED).first()
    steps = list(req.events.order_by("at", "id").values_list("to_state", flat=True))
    assert steps[0] == S.SUBMITTED and steps[-1] == req.state and S.PREEMPTED in steps

    # The first admission is kept across a preemption; the current run's admission is the requeued one.
    assert not history.filter(first_admitted_at__isnull=True).exists()
    assert not history.filter(first_admitted_at__gt=F("admitted_at")).exists()
    assert history.filter(events__to_state=S.PREEMPTED, first_admitted_at__lt=F("admitted_at")).exists()
    assert not history.filter(started_at__lt=F("admitted_at")).exists()

    # 5-minute samples, like the sampler's, with pending periods, borrowing, violations and a MIG shape mismatch.
    queue = QueueSample.objects.filter(seeded=True)
    assert counts["queue_samples"] == queue.count() and not QueueSample.objects.filter(seeded=False).exists()
    slots = queue.values("at").distinct().count()
    assert HISTORY_DAYS * 288 - 24 <= slots <= HISTORY_DAYS * 288 + 1
    assert all(at.timestamp() % 300 == 0 for at in queue.values_list("at", flat=True)[:500])
    assert queue.filter(pending__gt=0).exists()
    assert not queue.filter(pending_count__gt=0, pending_smallest=0).exists()
    assert not queue.filter(pending_count=0, pending_smallest__gt=0).exists()
    assert not PoolSample.objects.filter(seeded=True, promised=0).exists()
    assert queue.filter(borrowed__gt=0).exists()
    assert queue.filter(pending__gt=0, admitted__lt=F("nominal")).exists()  # waiting while below its guarantee
    assert PoolSample.objects.filter(seeded=True, shape_mismatch__gt=0, flavor__kind=Flavor.Kind.MIG).exists()
    assert not PoolSample.objects.filter(seeded=True, shape_mismatch__gt=0).exclude(flavor__kind=Flavor.Kind.MIG).exists()

    # Usage intervals for the cost charts, identifiable, and priced (the demo's prices start early enough).
    usage = UsageInterval.objects.filter(run_key__startswith=RUN_KEY_PREFIX)
    assert usage.count() == counts["usage"] >= counts["requests"]
    assert usage.filter(end_reason=UsageInterval.EndReason.EVICTED).count() >= 1
    first = usage.aggregate(first=Min("started_at"))["first"]
    assert Price.objects.filter(unit="gpu", effective_from__lte=first).exists()


def test_seed_is_idempotent(seeded) -> None:
    before = seeded_counts()
    from insights.demo import seed_insights_demo

    assert seed_insights_demo() == {"requests": 0, "samples": 0}
    call_command("seed_demo", stdout=io.StringIO())
    assert seeded_counts() == before

    # On an empty history it writes everything again. The samples' grid follows the clock (hour-aligned from three
    # weeks back, one per 5 minutes up to ten minutes ago), so it is written again at a time that gives the same grid:
    # a later minute could add a slot, a later hour drop twelve.
    first = QueueSample.objects.filter(seeded=True).aggregate(Min("at"))["at__min"]
    slots = QueueSample.objects.filter(seeded=True).values("at").distinct().count()
    end = max(first + slots * SLOT, first - timedelta(hours=1) + timedelta(days=HISTORY_DAYS))
    WorkloadRequest.objects.filter(seeded=True).delete()
    QueueSample.objects.all().delete()
    PoolSample.objects.all().delete()
    made = seed_insights_demo(now=end + timedelta(minutes=10))
    assert made["requests"] == before["requests"] and made["samples"] == before["queue_samples"] + before["pool_samples"]


def test_the_architecture_review_reads_the_demo_h100_zone_as_volcanos(seeded, client) -> None:
    """The review page answers from the live configuration: the demo's H100 zone runs E, Volcano gang-schedules
    training on its offline pool, and its last change (F -> E) agrees."""
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username="ops"))
    page = client.get("/ops/architecture-review/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Volcano gang-schedules training" in text and "(all workers start together or none)" in text
