"""The request page speaks as a researcher writes: parameters as a command line, the quota sentence in
"asks for / has / may borrow" terms, how long it has waited and where it stands in the queue."""

from __future__ import annotations

import html
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from workloads.models import RequestState
from workloads.pending import QueueUsage, pending_sentence, quota_detail, queue_line

from .factories import make_request

S = RequestState


def page(as_user, req) -> str:
    return html.unescape(as_user("carol").get(f"/requests/{req.pk}/").content.decode())


def cluster_queue(*, nominal: int, used: int, borrowing_limit: int | None, cohort: str = "acme") -> dict:
    resource = {"name": "nvidia.com/gpu", "nominalQuota": nominal}
    if borrowing_limit is not None:
        resource["borrowingLimit"] = borrowing_limit
    return {"spec": {"cohortName": cohort, "resourceGroups": [{"flavors": [{"name": "h100", "resources": [resource]}]}]},
            "status": {"flavorsUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": used}]}]}}


WAITING = {"objects": {"workload/job-req-1": {
    "c": {"QuotaReserved": ["False", "Pending", "couldn't assign flavors: insufficient quota for nvidia.com/gpu in flavor h100"]},
    "ev": 0, "cq": "acme-vision"}}}


def over_nominal(ahead: int = 0) -> str:
    return pending_sentence(state=S.QUEUED, kind="training", gpus_total=10, flavor_name="h100", flavor_label="H100",
                            resource="nvidia.com/gpu", cluster_status=WAITING,
                            cluster_queue=cluster_queue(nominal=6, used=8, borrowing_limit=4), ahead=ahead)


def test_over_nominal_sentence_says_what_it_asks_and_what_the_project_has() -> None:
    sentence = over_nominal()
    assert sentence == ("waiting for 10 x H100: asks for 10; the project has 6 and may borrow 4 (8 in use now); "
                        "nothing is ahead of you")
    assert "uses 8 of 6" not in sentence and "10 of 6" not in sentence


def test_quota_detail_without_cohort_or_limit() -> None:
    alone = QueueUsage(nominal=Decimal(8), used=Decimal(0), borrowing_limit=None, cohort="")
    assert quota_detail(asks=Decimal(4), usage=alone) == "asks for 4; the project has 8 and no cohort to borrow from"
    shared = QueueUsage(nominal=Decimal(6), used=Decimal(6), borrowing_limit=None, cohort="acme")
    assert quota_detail(asks=Decimal(2), usage=shared) == (
        "asks for 2; the project has 6 and may borrow from its tenant's cohort, which has nothing to lend now (6 in use now)")
    no_borrow = QueueUsage(nominal=Decimal(6), used=Decimal(6), borrowing_limit=Decimal(0), cohort="acme")
    assert "the project has 6 and may not borrow" in quota_detail(asks=Decimal(2), usage=no_borrow)


def test_queue_line_reads_as_a_sentence() -> None:
    now = timezone.now()
    assert queue_line(since=now - timedelta(minutes=12), now=now, ahead=1, queue="acme-vision") == (
        "pending for 12 min, 2nd in the queue acme-vision")
    assert queue_line(since=now - timedelta(hours=3, minutes=5), now=now, ahead=0) == "pending for 3 h 5 min, 1st in the queue"
    assert queue_line(since=now - timedelta(seconds=20), now=now, ahead=10) == "pending for less than a minute, 11th in the queue"
    assert queue_line(since=now - timedelta(days=2, hours=1), now=now, ahead=22) == "pending for 2 days 1 h, 23rd in the queue"


def test_page_shows_args_as_a_command_line_and_env_as_lines(as_user, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, parameters={
        "command": "python train.py", "args": ["--epochs", "3", "--name", "my run"],
        "env": {"WANDB_MODE": "offline", "SEED": "1"}, "resume": True, "notes": ""})
    body = page(as_user, req)
    assert "--epochs 3 --name 'my run'" in body
    assert "['--epochs', '3'" not in body
    assert "SEED=1<br>WANDB_MODE=offline" in body and "{'WANDB_MODE'" not in body
    assert "<dt>resume</dt><dd><code class=\"parameter-value\">yes</code>" in body
    assert "<dt>notes</dt><dd><span class=\"muted\">—</span>" in body


def test_page_hides_what_the_cluster_says_when_it_has_nothing_to_say(as_user, cast, cat) -> None:
    empty = make_request(cat, cast.vision, cast.carol, state=S.QUEUED, cluster_status={})
    assert "What the cluster says" not in page(as_user, empty)
    silent = make_request(cat, cast.vision, cast.carol, state=S.QUEUED,
                          cluster_status={"objects": {"workload/job-x": {"c": {}, "ev": 0}}})
    assert "What the cluster says" not in page(as_user, silent)
    talking = make_request(cat, cast.vision, cast.carol, state=S.QUEUED, cluster_status=WAITING)
    assert "What the cluster says" in page(as_user, talking)


def test_page_shows_the_over_nominal_sentence_time_pending_and_queue_position(as_user, cast, cat) -> None:
    now = timezone.now()
    make_request(cat, cast.vision, cast.carol, state=S.QUEUED,
                 queued_at=now - timedelta(minutes=50))
    req = make_request(cat, cast.vision, cast.carol, state=S.QUEUED, gpus=10, cluster_status=WAITING,
                       queued_at=now - timedelta(minutes=12, seconds=5), pending_reason=over_nominal(ahead=1))
    body = page(as_user, req)
    assert "Waiting for 10 x H100: asks for 10; the project has 6 and may borrow 4" in body
    assert "Pending for 12 min, 2nd in the queue acme-vision" in body


def test_no_queue_line_once_it_runs(as_user, cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, queued_at=timezone.now() - timedelta(minutes=5))
    assert "in the queue" not in page(as_user, req)
