"""Request services: validation and refusals, approval rules, decisions, lifecycle actions, idempotency."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from portal.exceptions import ConflictError, IdempotencyKeyReused, Invalid, NotAllowed, ReadOnlyTenant
from quotas.models import Quota
from tenants.models import AuditEntry, Project, Tenant
from workloads import services
from workloads.catalogue import seed_catalogue
from workloads.models import ApprovalRule, Image, RequestEvent, RequestState, ServiceTemplate, WorkloadRequest
from workloads.schema import form_fields, parameter_errors

from .factories import make_request

S = RequestState
TRAIN = {"command": "python train.py"}


def submit(cast, cat, who: str = "carol", *, project=None, template=None, **values):
    template = template or cat.training
    if "parameters" not in values:
        values["parameters"] = {"training": TRAIN, "inference": {"model_uri": "hf://org/model"}}.get(template.slug, {})
    values.setdefault("flavor", cat.h100)
    return services.request_submit(actor=cast.actor(who), project=project or cast.vision, template=template, **values)


def nothing_created() -> bool:
    return not WorkloadRequest.objects.exists() and not RequestEvent.objects.exists() and not AuditEntry.objects.filter(
        action__startswith="request."
    ).exists()


# Submitting and the approval rules ---------------------------------------------------------------


def test_small_request_is_auto_approved_and_materialization_scheduled(
    cast, cat, hooks_called, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        req = submit(cast, cat, gpus=2, duration_hours=8)
    assert req.state == S.APPROVED and req.replayed is False
    assert req.priority == "batch" and req.image == "nvcr.io/nvidia/pytorch:26.10-py3"
    # Defaults from the schema are stored, so materialization sees complete parameters.
    assert req.parameters == {"command": "python train.py", "args": [], "env": {}, "data_volume": "", "retries": 0,
                              "distributed": False, "workers": 1}
    assert [(e.from_state, e.to_state, e.actor_label) for e in req.events.all()] == [
        ("", S.SUBMITTED, "carol"), (S.SUBMITTED, S.APPROVED, "approval rule"),
    ]
    assert hooks_called == [("approved", req.pk)]
    assert AuditEntry.objects.filter(action="request.submit", actor=cast.carol, project=cast.vision).exists()
    assert req.k8s_name == f"req-{req.pk}"


@pytest.mark.parametrize(
    "values, reason",
    [
        ({"gpus": 3}, "3 GPUs is more than the 2 approved automatically"),
        ({"gpus": 1, "duration_hours": 9}, "9 hours is more than the 8 approved automatically"),
    ],
)
def test_bigger_request_waits_for_approval(cast, cat, hooks_called, values, reason, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        req = submit(cast, cat, **values)
    assert req.state == S.PENDING_APPROVAL
    assert reason in req.pending_reason and reason in req.state_reason
    assert hooks_called == []


def test_inference_needs_a_project_admin_unless_one_submits(cast, cat) -> None:
    req = submit(cast, cat, template=cat.inference, gpus=1)
    assert req.state == S.PENDING_APPROVAL and "Inference services need" in req.pending_reason
    assert req.priority == "production"
    # Production priority always waits for an approver's decision, even the admin's own (tests/workloads/test_security.py).
    by_admin = submit(cast, cat, "bob", template=cat.inference, gpus=1)
    assert by_admin.state == S.PENDING_APPROVAL and "Priority production" in by_admin.pending_reason
    # Nor can the admin step around it with a lower class: inference runs in the online class only (docs/inference.md).
    with pytest.raises(ValidationError) as refused:
        submit(cast, cat, "bob", template=cat.inference, gpus=1, priority="batch")
    assert "always run at production priority" in refused.value.message_dict["priority"][0]


def test_no_rule_means_a_human_decides(cast, cat) -> None:
    ApprovalRule.objects.all().delete()
    req = submit(cast, cat, gpus=1)
    assert req.state == S.PENDING_APPROVAL and "No approval rule" in req.pending_reason


def test_most_specific_rule_wins(cast, cat) -> None:
    ApprovalRule.objects.create(project=None, template_slug="training", auto_approve_max_gpus=4, auto_approve_max_hours=24)
    assert submit(cast, cat, gpus=4, duration_hours=20).state == S.APPROVED  # template rule beats the global one
    ApprovalRule.objects.create(project=cast.vision, template_slug="", auto_approve_max_gpus=0, auto_approve_max_hours=0)
    assert submit(cast, cat, gpus=1).state == S.PENDING_APPROVAL  # project rule beats template rules
    assert submit(cast, cat, project=cast.nlp, gpus=2).state == S.APPROVED  # ...only in its project
    ApprovalRule.objects.create(project=cast.vision, template_slug="training", auto_approve_max_gpus=1, auto_approve_max_hours=4)
    assert submit(cast, cat, gpus=1, duration_hours=4).state == S.APPROVED  # project + template is most specific
    assert submit(cast, cat, template=cat.notebook, gpus=1).state == S.PENDING_APPROVAL  # notebook: project rule
    rule = services.approval_rule_for(project=cast.vision, template=cat.training)
    assert (rule.project, rule.template_slug) == (cast.vision, "training")


# Refused at once, nothing created ------------------------------------------------------------------


def test_more_than_quota_plus_borrowing_can_never_run(cast, cat) -> None:
    # acme-vision: 8 nominal + 2 borrowable H100. 2 workers x 6 GPUs = 12.
    with pytest.raises(Invalid) as exc:
        submit(cast, cat, gpus=6, parameters=TRAIN | {"distributed": True, "workers": 2})
    assert exc.value.field == "replicas"
    assert "can never run" in exc.value.message and "8 nominal + 2 borrowable = 10" in exc.value.message
    assert nothing_created()
    # Exactly the ceiling is fine (it may wait, but it can run).
    assert submit(cast, cat, gpus=5, parameters=TRAIN | {"distributed": True, "workers": 2}).replicas == 2


def test_no_quota_in_the_flavor_can_never_run(cast, cat) -> None:
    with pytest.raises(Invalid) as exc:
        submit(cast, cat, project=cast.nlp, flavor=cat.mig, gpus=1)
    assert "has no quota for A100 1g.10gb" in exc.value.message and exc.value.field == "gpus"
    assert nothing_created()


def test_without_a_borrowing_limit_the_tenant_pool_bounds_it(cast, cat) -> None:
    # acme-nlp: 2 nominal, no borrowing limit; acme's pool for H100 is 12.
    ApprovalRule.objects.all().delete()
    assert submit(cast, cat, project=cast.nlp, gpus=6, parameters=TRAIN | {"distributed": True, "workers": 2}).replicas == 2
    with pytest.raises(Invalid, match="no borrowing limit = 12"):
        submit(cast, cat, project=cast.nlp, gpus=7, parameters=TRAIN | {"distributed": True, "workers": 2})


@pytest.mark.parametrize(
    "values, field, text",
    [
        ({"flavor": "cpu"}, "flavor", "not allowed for Training job"),
        ({"image": "docker.io/evil/miner:latest"}, "image", "not in the curated list"),
        ({"image": "vllm/vllm-openai:v0.12.0"}, "image", "not in the curated list"),  # curated, but for inference
        ({"gpus": 9}, "gpus", "At most 8"),
        ({"gpus": 0}, "gpus", "At least 1"),
        ({"duration_hours": 73}, "duration_hours", "At most 72 hours"),
        ({"memory_gib": 100000}, "memory_gib", "Between 1 and 512"),
        ({"name": "Not_A_Label"}, "name", "DNS-1123"),
        ({"priority": "urgent"}, "priority", "One of"),
        ({"replicas": 3}, "replicas", "parameters.workers"),
        ({"parameters": {"command": "x", "retries": 11}}, "parameters.retries", "11 is greater than the maximum of 10"),
        ({"parameters": {"args": ["a"]}}, "parameters.command", "required"),
        ({"parameters": {"command": "x", "args": ["ok", 5]}}, "parameters.args.1", "is not of type 'string'"),
        ({"parameters": {"command": "x", "bogus": 1}}, "parameters.bogus", "Unknown parameter"),
        ({"parameters": {"command": "x", "env": {"1BAD": "v"}}}, "parameters.env", "does not match"),
        ({"parameters": ["not", "an", "object"]}, "parameters", "must be a JSON object"),
    ],
)
def test_invalid_requests_name_the_field(cast, cat, values, field, text) -> None:
    if values.get("flavor") == "cpu":
        values["flavor"] = cat.cpu
    with pytest.raises(ValidationError) as exc:
        submit(cast, cat, **values)
    errors = exc.value.message_dict
    assert field in errors, errors
    assert any(text in message for message in errors[field]), errors
    assert nothing_created()


def volcano_owned_h100(cat, *, architecture: str = "E", pool: str = "offline") -> None:
    """The H100 flavor as the offline pool's whole GPUs: under E Volcano alone hands them out."""
    type(cat.cluster).objects.filter(pk=cat.cluster.pk).update(architecture=architecture)
    type(cat.h100).objects.filter(pk=cat.h100.pk).update(pool_label=pool)
    cat.h100.refresh_from_db()


@pytest.mark.parametrize("slug", ["notebook", "inference"])
def test_kueue_workloads_on_volcano_owned_gpus_are_refused(cast, cat, slug) -> None:
    # Notebooks and inference always render to Kueue objects; Kueue has no ResourceFlavor for these nodes.
    volcano_owned_h100(cat)
    with pytest.raises(ValidationError) as exc:
        submit(cast, cat, template=getattr(cat, slug), gpus=1)
    errors = exc.value.message_dict
    assert list(errors) == ["flavor"], errors
    assert "only Volcano schedules" in errors["flavor"][0] and "Choose another flavor" in errors["flavor"][0]
    assert nothing_created()


@pytest.mark.parametrize("parameters", [TRAIN, TRAIN | {"distributed": True, "workers": 2}])
def test_training_on_volcano_owned_gpus_goes_ahead(cast, cat, parameters) -> None:
    # Training there renders to a Volcano Job, single-node too (workloads.kinds.uses_volcano).
    volcano_owned_h100(cat)
    req = submit(cast, cat, gpus=1, parameters=parameters)
    assert req.flavor == cat.h100 and req.state == S.APPROVED


@pytest.mark.parametrize(("architecture", "pool"), [("E", "online"), ("E", ""), ("F", "offline"), ("C", "offline")])
def test_notebooks_on_gpus_kueue_owns_go_ahead(cast, cat, architecture, pool) -> None:
    volcano_owned_h100(cat, architecture=architecture, pool=pool)
    assert submit(cast, cat, template=cat.notebook, gpus=1).flavor == cat.h100


def test_several_problems_are_reported_together(cast, cat) -> None:
    with pytest.raises(ValidationError) as exc:
        submit(cast, cat, gpus=9, duration_hours=100, parameters={"retries": -1})
    assert {"gpus", "duration_hours", "parameters.command", "parameters.retries"} <= set(exc.value.message_dict)


def test_custom_images_only_where_the_project_allows_them(cast, cat) -> None:
    Project.objects.filter(pk=cast.vision.pk).update(allow_custom_images=True)
    req = submit(cast, cat, image="ghcr.io/acme/trainer:1.2")
    assert req.image == "ghcr.io/acme/trainer:1.2"
    with pytest.raises(ValidationError):
        submit(cast, cat, project=cast.nlp, image="ghcr.io/acme/trainer:1.2")


def test_suspended_tenant_and_archived_project_are_refused(cast, cat) -> None:
    Tenant.objects.filter(pk=cast.acme.pk).update(status=Tenant.Status.SUSPENDED)
    with pytest.raises(ReadOnlyTenant):
        submit(cast, cat, "ops")  # not even ops start work in a suspended tenant
    Tenant.objects.filter(pk=cast.acme.pk).update(status=Tenant.Status.ACTIVE)
    Project.objects.filter(pk=cast.vision.pk).update(status=Project.Status.ARCHIVED)
    with pytest.raises(Invalid, match="archived") as exc:
        submit(cast, cat)
    assert exc.value.field == "project"
    assert nothing_created()


@pytest.mark.parametrize("who", ["dave", "erin", "nobody"])
def test_only_submitters_submit(cast, cat, who) -> None:
    with pytest.raises(NotAllowed):
        submit(cast, cat, who)
    assert nothing_created()


def test_inactive_template_is_refused(cast, cat) -> None:
    ServiceTemplate.objects.filter(pk=cat.training.pk).update(active=False)
    cat.training.refresh_from_db()
    with pytest.raises(Invalid, match="no longer offered"):
        submit(cast, cat)


def test_active_names_are_unique_in_the_project(cast, cat) -> None:
    first = submit(cast, cat, name="resnet")
    with pytest.raises(ValidationError) as exc:
        submit(cast, cat, name="resnet")
    assert "already in use" in exc.value.message_dict["name"][0]
    services.request_cancel(actor=cast.actor("carol"), request=first)
    assert submit(cast, cat, name="resnet").name == "resnet"  # free again once the first one ended


# Idempotency ----------------------------------------------------------------------------------


def test_same_idempotency_key_returns_the_same_request(cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        first = submit(cast, cat, idempotency_key="ci-build-42")
    counts = (WorkloadRequest.objects.count(), RequestEvent.objects.count(), AuditEntry.objects.count())
    with django_capture_on_commit_callbacks(execute=True):
        again = submit(cast, cat, idempotency_key="ci-build-42")
    assert again.pk == first.pk and again.replayed is True and first.replayed is False
    assert (WorkloadRequest.objects.count(), RequestEvent.objects.count(), AuditEntry.objects.count()) == counts
    assert hooks_called == [("approved", first.pk)]  # materialization is not scheduled twice
    # Keys are per user: bob's "ci-build-42" is another request.
    assert submit(cast, cat, "bob", idempotency_key="ci-build-42").pk != first.pk
    # The same key for a different request (another project, or another body) is a client bug.
    with pytest.raises(IdempotencyKeyReused):
        submit(cast, cat, project=cast.nlp, idempotency_key="ci-build-42")
    with pytest.raises(IdempotencyKeyReused):
        submit(cast, cat, idempotency_key="ci-build-42", gpus=1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_key_create_one_request(cast, cat) -> None:
    barrier = threading.Barrier(4)
    ids: list[int] = []
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            barrier.wait()
            ids.append(submit(cast, cat, idempotency_key="retry-storm").pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(ids)) == 1 and len(ids) == 4
    assert WorkloadRequest.objects.filter(idempotency_key="retry-storm").count() == 1
    assert AuditEntry.objects.filter(action="request.submit").count() == 1


# Deciding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["bob", "alice", "ops"])
def test_approvers_approve_and_the_requester_hears(cast, cat, who, hooks_called, mailoutbox, django_capture_on_commit_callbacks) -> None:
    req = submit(cast, cat, gpus=4)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_approve(actor=cast.actor(who), request=req, comment="go ahead")
    req.refresh_from_db()
    assert req.state == S.APPROVED and req.approved_by == getattr(cast, who) and req.pending_reason == ""
    assert "go ahead" in req.state_reason
    assert hooks_called == [("approved", req.pk)]
    [mail] = mailoutbox
    assert mail.to == ["carol@example.com"] and "approved" in mail.subject and "go ahead" in mail.body
    assert AuditEntry.objects.filter(action="request.approved", actor=getattr(cast, who)).exists()


@pytest.mark.parametrize("who", ["carol", "dave", "erin", "frank", "nobody"])
def test_others_cannot_decide(cast, cat, who) -> None:
    req = submit(cast, cat, gpus=4)
    for decide in (services.request_approve, services.request_reject):
        with pytest.raises(NotAllowed):
            decide(actor=cast.actor(who), request=req)
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.PENDING_APPROVAL


def test_a_decided_request_cannot_be_decided_again(cast, cat, mailoutbox, django_capture_on_commit_callbacks) -> None:
    req = submit(cast, cat, gpus=4)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_reject(actor=cast.actor("bob"), request=req, comment="use fewer GPUs")
    with pytest.raises(ConflictError, match="rejected"):
        services.request_approve(actor=cast.actor("alice"), request=req)
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.REJECTED
    assert "rejected" in mailoutbox[0].subject and "use fewer GPUs" in mailoutbox[0].body


def test_webhook_is_called_on_decisions(cast, cat, settings, django_capture_on_commit_callbacks) -> None:
    received: list[dict] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.handle_request, daemon=True).start()
    settings.PORTAL_WEBHOOK_URL = f"http://127.0.0.1:{server.server_port}/hook"
    req = submit(cast, cat, gpus=4)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_approve(actor=cast.actor("bob"), request=req, comment="ok")
    server.server_close()
    assert received and received[0]["event"] == "request.approved" and received[0]["request"] == req.pk
    assert received[0]["by"] == "bob" and received[0]["requested_by"] == "carol"


# Lifecycle actions ----------------------------------------------------------------------------


def test_cancel_before_running_only(cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    req = submit(cast, cat, gpus=4)
    with pytest.raises(NotAllowed):
        services.request_cancel(actor=cast.actor("dave"), request=req)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_cancel(actor=cast.actor("carol"), request=req, reason="wrong data")
    assert WorkloadRequest.objects.get(pk=req.pk).state == S.CANCELLED
    assert hooks_called == [("cancel", req.pk)]
    running = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    with pytest.raises(ConflictError, match="Stop it instead"):
        services.request_cancel(actor=cast.actor("bob"), request=running)


def test_stop_and_restart(cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    req = make_request(cat, cast.vision, cast.carol, template=cat.notebook, state=S.RUNNING, parameters={})
    with django_capture_on_commit_callbacks(execute=True):
        services.request_stop(actor=cast.actor("carol"), request=req)
    req.refresh_from_db()
    assert req.state == S.STOPPED and req.finished_at is not None
    with django_capture_on_commit_callbacks(execute=True):
        services.request_restart(actor=cast.actor("carol"), request=req)
    req.refresh_from_db()
    assert req.state == S.APPROVED and req.finished_at is None and req.started_at is None
    assert hooks_called == [("stop", req.pk), ("approved", req.pk)]
    with pytest.raises(ConflictError):
        services.request_restart(actor=cast.actor("carol"), request=req)  # it is not stopped now
    with pytest.raises(NotAllowed):
        services.request_stop(actor=cast.actor("dave"), request=req)


def test_restart_refused_when_quota_shrank(cast, cat) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.STOPPED, gpus=6)
    Quota.objects.filter(project=cast.vision, flavor=cat.h100).update(nominal=2, borrowing_limit=0)
    with pytest.raises(Invalid, match="can never run"):
        services.request_restart(actor=cast.actor("carol"), request=req)


def test_delete_ends_the_request_and_removes_its_objects(cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    running = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    pending = make_request(cat, cast.vision, cast.carol, state=S.PENDING_APPROVAL)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_delete(actor=cast.actor("bob"), request=running)
        services.request_delete(actor=cast.actor("carol"), request=pending)
    assert WorkloadRequest.objects.get(pk=running.pk).state == S.STOPPED
    assert WorkloadRequest.objects.get(pk=pending.pk).state == S.CANCELLED
    assert running.events.filter(message__startswith="Deleted").exists()
    assert hooks_called == [("delete", running.pk), ("delete", pending.pk)]


def test_extend(cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, duration_hours=4)
    with django_capture_on_commit_callbacks(execute=True):
        services.request_extend(actor=cast.actor("carol"), request=req, hours=4)  # 8 h: within the rule
    assert WorkloadRequest.objects.get(pk=req.pk).duration_hours == 8
    assert hooks_called == [("extend", req.pk)]
    with pytest.raises(NotAllowed, match="needs a project admin"):
        services.request_extend(actor=cast.actor("carol"), request=req, hours=2)  # 10 h > 8 auto-approved
    services.request_extend(actor=cast.actor("bob"), request=req, hours=2)  # an approver may
    with pytest.raises(Invalid, match="maximum of 72 hours") as exc:
        services.request_extend(actor=cast.actor("bob"), request=req, hours=100)
    assert exc.value.field == "hours"
    assert WorkloadRequest.objects.get(pk=req.pk).duration_hours == 10
    assert AuditEntry.objects.filter(action="request.extend").count() == 2


def test_extend_while_pending_is_for_the_approver_to_judge(cast, cat) -> None:
    req = submit(cast, cat, gpus=4, duration_hours=8)
    services.request_extend(actor=cast.actor("carol"), request=req, hours=16)
    assert WorkloadRequest.objects.get(pk=req.pk).duration_hours == 24


def test_extend_moves_the_deadline(cast, cat) -> None:
    from django.utils import timezone

    deadline = timezone.now()
    req = make_request(cat, cast.vision, cast.carol, state=S.RUNNING, duration_hours=2, expires_at=deadline)
    services.request_extend(actor=cast.actor("carol"), request=req, hours=3)
    assert WorkloadRequest.objects.get(pk=req.pk).expires_at == deadline + timezone.timedelta(hours=3)


def test_scale_inference(cast, cat, hooks_called, django_capture_on_commit_callbacks) -> None:
    req = make_request(cat, cast.vision, cast.carol, template=cat.inference, state=S.RUNNING, gpus=2, replicas=2)
    with pytest.raises(NotAllowed):
        services.request_scale(actor=cast.actor("carol"), request=req, replicas=3)  # inference: a project admin scales up
    with django_capture_on_commit_callbacks(execute=True):
        services.request_scale(actor=cast.actor("carol"), request=req, replicas=1)
        services.request_scale(actor=cast.actor("bob"), request=req, replicas=5)
    assert WorkloadRequest.objects.get(pk=req.pk).replicas == 5
    assert hooks_called == [("scale", req.pk), ("scale", req.pk)]
    with pytest.raises(Invalid, match="can never run"):
        services.request_scale(actor=cast.actor("bob"), request=req, replicas=6)  # 12 > 10
    training = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    with pytest.raises(Invalid, match="Only inference"):
        services.request_scale(actor=cast.actor("bob"), request=training, replicas=2)


def test_actions_on_a_suspended_tenant(cast, cat) -> None:
    running = make_request(cat, cast.vision, cast.carol, state=S.RUNNING)
    stopped = make_request(cat, cast.vision, cast.carol, state=S.STOPPED)
    Tenant.objects.filter(pk=cast.acme.pk).update(status=Tenant.Status.SUSPENDED)
    with pytest.raises(ReadOnlyTenant):
        services.request_restart(actor=cast.actor("carol"), request=stopped)
    with pytest.raises(ReadOnlyTenant):
        services.request_extend(actor=cast.actor("carol"), request=running, hours=1)
    services.request_stop(actor=cast.actor("carol"), request=running)  # giving capacity back is always possible


# Hooks, catalogue, schema ---------------------------------------------------------------------


@pytest.mark.django_db
def test_seed_catalogue_is_idempotent_and_links_gpu_flavors(cast, cat) -> None:
    assert seed_catalogue() == {"templates": 0, "images": 0, "rules": 0}
    assert set(cat.training.allowed_flavors.values_list("name", flat=True)) == {"h100", "a100-1g.10gb"}
    assert Image.objects.count() == 3 and ApprovalRule.objects.get().project is None
    for template in ServiceTemplate.objects.all():
        assert parameter_errors(template.parameters_schema, {**({"command": "x"} if template.slug == "training" else {}),
                                                             **({"model_uri": "m"} if template.slug in ("inference", "batch-inference")
                                                                else {})}) == {}


def test_form_fields_describe_the_schema(cat) -> None:
    fields = {f["name"]: f for f in form_fields(cat.training.parameters_schema)}
    assert fields["retries"] | {} == fields["retries"]
    assert (fields["retries"]["type"], fields["retries"]["minimum"], fields["retries"]["maximum"], fields["retries"]["default"]) == ("integer", 0, 10, 0)
    assert fields["command"]["required"] is True and fields["args"]["widget"] == "list" and fields["args"]["items"] == {"type": "string"}
    assert fields["distributed"]["widget"] == "checkbox"
    ide = {f["name"]: f for f in form_fields(cat.notebook.parameters_schema)}["ide"]
    assert ide["widget"] == "select" and ide["enum"] == ["jupyterlab", "vscode"] and ide["label"] == "IDE"
