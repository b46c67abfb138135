"""The authorisation matrix: every ``may_*`` predicate × role × own or foreign tenant.

The cast (tests/conftest.py): in acme, alice is tenant admin, bob project admin of acme-vision, carol a
member and dave a viewer there; nobody belongs nowhere; ops is platform ops. The "foreign" column
asks the same question about globex (its project globex-llm, frank's requests there), where none of
them but ops has a role. Each row lists who is allowed; everyone else must be refused.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from billing import policy as billing_policy
from insights import policy as insights_policy
from maintenance import policy as maintenance_policy
from maintenance.models import MigChange
from quotas import policy as quotas_policy
from quotas.models import QuotaRequest
from tenants import policy as tenants_policy
from tenants.models import LoginSettings, Tenant
from workloads import policy as workloads_policy

from .workloads.factories import make_catalogue, make_request

ROLES = ["ops", "alice", "bob", "carol", "dave", "nobody"]
EVERY_MEMBER = {"ops", "alice", "bob", "carol", "dave"}
SUBMITTERS = {"ops", "alice", "bob", "carol"}
APPROVERS = {"ops", "alice", "bob"}
ADMINS = {"ops", "alice"}
OPS = {"ops"}
NONE: set[str] = set()


class World:
    """What the predicates are asked about, at home (acme) and abroad (globex)."""

    def __init__(self, cast: Any) -> None:
        self.cast = cast
        cat = make_catalogue(cast)
        self.tenant = {"home": cast.acme, "foreign": cast.globex}
        self.project = {"home": cast.vision, "foreign": cast.llm}
        self.request = {"home": make_request(cat, cast.vision, cast.carol),
                        "foreign": make_request(cat, cast.llm, cast.frank)}
        self.notebook = {"home": make_request(cat, cast.vision, cast.carol, template=cat.notebook),
                         "foreign": make_request(cat, cast.llm, cast.frank, template=cat.notebook)}
        self.quota_request = {
            where: QuotaRequest.objects.create(
                project=project, flavor=cat.h100, resource="nvidia.com/gpu", amount=Decimal(1), reason="more",
                requested_by=who, approver=QuotaRequest.Approver.PROJECT_ADMIN,
            )
            for where, project, who in (("home", cast.vision, cast.carol), ("foreign", cast.llm, cast.frank))
        }
        # MIG changes proposed by each tenant's admin (alice at home, erin abroad).
        now = timezone.now()
        self.mig_change = {
            where: MigChange.objects.create(cluster=cat.cluster, pool_name="a100-mig", nodes=["n0"], gpu_model="a100-80gb",
                                            from_layout="all-balanced", to_layout="all-1g.10gb", tenant=tenant,
                                            proposed_by=who, window_start=now, deadline=now)
            for where, tenant, who in (("home", cast.acme, cast.alice), ("foreign", cast.globex, cast.erin))
        }


def _suspended(tenant: Tenant) -> Tenant:
    tenant.status = Tenant.Status.SUSPENDED  # in memory only: the predicate reads the object it is given
    return tenant


def _opened(req: Any) -> Any:
    req.project.notebooks_open_to_approvers = True
    return req


Ask = Callable[[Any, World, str], bool]
# (predicate, question, allowed at home, allowed in the foreign tenant)
MATRIX: list[tuple[str, Ask, set[str], set[str]]] = [
    ("tenants.may_operate", lambda a, w, x: tenants_policy.may_operate(a), OPS, OPS),
    ("tenants.may_view_tenant", lambda a, w, x: tenants_policy.may_view_tenant(a, w.tenant[x]), EVERY_MEMBER, OPS),
    ("tenants.may_change_tenant", lambda a, w, x: tenants_policy.may_change_tenant(a, w.tenant[x]), ADMINS, OPS),
    ("tenants.may_manage_members", lambda a, w, x: tenants_policy.may_manage_members(a, w.tenant[x]), ADMINS, OPS),
    ("tenants.may_write_in (active)", lambda a, w, x: tenants_policy.may_write_in(a, w.tenant[x]),
     set(ROLES), set(ROLES)),
    ("tenants.may_write_in (suspended)", lambda a, w, x: tenants_policy.may_write_in(a, _suspended(w.tenant[x])),
     OPS, OPS),
    ("tenants.may_view_project", lambda a, w, x: tenants_policy.may_view_project(a, w.project[x]), EVERY_MEMBER, OPS),
    ("tenants.may_change_project", lambda a, w, x: tenants_policy.may_change_project(a, w.project[x]), APPROVERS, OPS),
    ("tenants.may_submit", lambda a, w, x: tenants_policy.may_submit(a, w.project[x]), SUBMITTERS, OPS),
    ("tenants.may_approve", lambda a, w, x: tenants_policy.may_approve(a, w.project[x]), APPROVERS, OPS),
    # Not about one tenant: the same answer in both columns.
    ("tenants.may_manage_some_tenant", lambda a, w, x: tenants_policy.may_manage_some_tenant(a), ADMINS, ADMINS),
    ("tenants.may_manage_identity", lambda a, w, x: tenants_policy.may_manage_identity(a), OPS, OPS),
    ("tenants.may_use_password (password on)",
     lambda a, w, x: tenants_policy.may_use_password(a, LoginSettings(password_login_staff_only=False)),
     set(ROLES), set(ROLES)),
    ("tenants.may_use_password (staff only)",
     lambda a, w, x: tenants_policy.may_use_password(a, LoginSettings(password_login_staff_only=True)), OPS, OPS),
    ("quotas.may_manage_capacity", lambda a, w, x: quotas_policy.may_manage_capacity(a), OPS, OPS),
    ("quotas.may_set_quota (tenant)", lambda a, w, x: quotas_policy.may_set_quota(a, tenant=w.tenant[x]), OPS, OPS),
    ("quotas.may_set_quota (project)", lambda a, w, x: quotas_policy.may_set_quota(a, project=w.project[x]),
     ADMINS, OPS),
    ("quotas.may_split_quota", lambda a, w, x: quotas_policy.may_split_quota(a, w.tenant[x]), ADMINS, OPS),
    ("quotas.may_request_quota", lambda a, w, x: quotas_policy.may_request_quota(a, w.project[x]), SUBMITTERS, OPS),
    ("quotas.may_decide (project tier)",
     lambda a, w, x: quotas_policy.may_decide(a, w.quota_request[x], tier=QuotaRequest.Approver.PROJECT_ADMIN),
     APPROVERS, OPS),
    ("quotas.may_decide (tenant tier)",
     lambda a, w, x: quotas_policy.may_decide(a, w.quota_request[x], tier=QuotaRequest.Approver.TENANT_ADMIN),
     ADMINS, OPS),
    ("quotas.may_decide (ops tier)",
     lambda a, w, x: quotas_policy.may_decide(a, w.quota_request[x], tier=QuotaRequest.Approver.OPS), OPS, OPS),
    # carol asked at home, frank abroad: only the requester withdraws (approvers reject).
    ("quotas.may_withdraw", lambda a, w, x: quotas_policy.may_withdraw(a, w.quota_request[x]), {"carol"}, NONE),
    ("workloads.may_submit_request", lambda a, w, x: workloads_policy.may_submit_request(a, w.project[x]),
     SUBMITTERS, OPS),
    ("workloads.may_decide", lambda a, w, x: workloads_policy.may_decide(a, w.project[x]), APPROVERS, OPS),
    ("workloads.may_submit_somewhere", lambda a, w, x: workloads_policy.may_submit_somewhere(a), SUBMITTERS, SUBMITTERS),
    ("workloads.may_decide_somewhere", lambda a, w, x: workloads_policy.may_decide_somewhere(a), APPROVERS, APPROVERS),
    ("workloads.may_act_on", lambda a, w, x: workloads_policy.may_act_on(a, w.request[x]), SUBMITTERS, OPS),
    ("workloads.may_manage_inference_keys",
     lambda a, w, x: workloads_policy.may_manage_inference_keys(a, w.request[x]), SUBMITTERS, OPS),
    ("workloads.may_ask_extension", lambda a, w, x: workloads_policy.may_ask_extension(a, w.request[x]), {"carol"}, NONE),
    ("workloads.may_view_request", lambda a, w, x: workloads_policy.may_view_request(a, w.request[x]),
     EVERY_MEMBER, OPS),
    ("workloads.may_read_logs", lambda a, w, x: workloads_policy.may_read_logs(a, w.request[x]), EVERY_MEMBER, OPS),
    ("workloads.may_share_request", lambda a, w, x: workloads_policy.may_share_request(a, w.request[x]),
     SUBMITTERS, OPS),
    ("workloads.may_manage_catalogue", lambda a, w, x: workloads_policy.may_manage_catalogue(a), OPS, OPS),
    ("workloads.may_set_rules (project)", lambda a, w, x: workloads_policy.may_set_rules(a, w.project[x]),
     APPROVERS, OPS),
    ("workloads.may_set_rules (global)", lambda a, w, x: workloads_policy.may_set_rules(a, None), OPS, OPS),
    ("workloads.may_open_notebook", lambda a, w, x: workloads_policy.may_open_notebook(a, w.notebook[x]),
     {"carol"}, NONE),
    ("workloads.may_open_notebook (open to approvers)",
     lambda a, w, x: workloads_policy.may_open_notebook(a, _opened(w.notebook[x])), APPROVERS | {"carol"}, OPS),
    ("billing.may_manage_prices", lambda a, w, x: billing_policy.may_manage_prices(a), OPS, OPS),
    ("billing.may_view_statements", lambda a, w, x: billing_policy.may_view_statements(a, w.tenant[x]), ADMINS, OPS),
    ("billing.may_view_some_statements", lambda a, w, x: billing_policy.may_view_some_statements(a), ADMINS, ADMINS),
    ("billing.may_view_project_costs", lambda a, w, x: billing_policy.may_view_project_costs(a, w.project[x]),
     EVERY_MEMBER, OPS),
    ("billing.may_view_tenant_costs", lambda a, w, x: billing_policy.may_view_tenant_costs(a, w.tenant[x]), ADMINS, OPS),
    ("insights.may_view_metrics", lambda a, w, x: insights_policy.may_view_metrics(a, w.tenant[x]), ADMINS, OPS),
    ("insights.may_view_all_metrics", lambda a, w, x: insights_policy.may_view_all_metrics(a), OPS, OPS),
    ("insights.may_view_some_metrics", lambda a, w, x: insights_policy.may_view_some_metrics(a), ADMINS, ADMINS),
    # Not about one tenant: the same answer in both columns.
    ("maintenance.may_view_mig_changes", lambda a, w, x: maintenance_policy.may_view_mig_changes(a), ADMINS, ADMINS),
    ("maintenance.may_view_mig_change", lambda a, w, x: maintenance_policy.may_view_mig_change(a, w.mig_change[x]),
     ADMINS, OPS),
    ("maintenance.may_propose_mig_change",
     lambda a, w, x: maintenance_policy.may_propose_mig_change(a, w.tenant[x]), ADMINS, OPS),
    # ops decide (alice proposed at home, erin abroad: never the proposer, see test_maintenance policy tests)
    ("maintenance.may_decide_mig_change",
     lambda a, w, x: maintenance_policy.may_decide_mig_change(a, w.mig_change[x]), OPS, OPS),
    ("maintenance.may_cancel_mig_change",
     lambda a, w, x: maintenance_policy.may_cancel_mig_change(a, w.mig_change[x]), ADMINS, OPS),
]


@pytest.mark.parametrize(("name", "ask", "home", "foreign"), MATRIX, ids=[row[0] for row in MATRIX])
def test_policy_matrix(cast, name: str, ask: Ask, home: set[str], foreign: set[str]) -> None:
    world = World(cast)
    expected = {(who, where): who in allowed for who in ROLES for where, allowed in (("home", home), ("foreign", foreign))}
    answered = {(who, where): ask(cast.actor(who), world, where) for who in ROLES for where in ("home", "foreign")}
    wrong = {key: answered[key] for key in expected if answered[key] != expected[key]}
    assert not wrong, f"{name}: these (role, tenant) pairs got the wrong answer: {wrong}"


REFUSED_TO_THE_SYSTEM = ("workloads.may_open_notebook", "tenants.may_write_in (suspended)", "quotas.may_request_quota",
                         "quotas.may_withdraw", "workloads.may_ask_extension")


def test_the_system_actor_may_everything_but_open_notebooks_write_suspended_ask_or_withdraw(cast) -> None:
    from tenants.access import Actor

    world = World(cast)
    system = Actor.system()
    for name, ask, _home, _foreign in MATRIX:
        expected = not name.startswith(REFUSED_TO_THE_SYSTEM)
        assert ask(system, world, "home") is expected, name


def test_every_predicate_templates_may_ask_is_in_the_matrix() -> None:
    """``{% may %}`` asks any installed predicate by name: each one has its row here."""
    from tenants.policy import PREDICATES

    assert set(PREDICATES) == {name.split(" ")[0] for name, *_ in MATRIX}


# Queryset twins: who holds a predicate ----------------------------------------------------------------------------
#
# Every predicate that decides who is told something declares its twin (``tenants.policy.with_holders``);
# ``tenants.policy.holders`` asks it. For each user of the cast (and a superuser, a disabled tenant admin, an ops
# member whose staff flag was taken away) and each object, the twin's queryset holds the user exactly when the
# predicate says yes. Quota requests include one asked by bob, a project admin: he may not decide his own.

def _twins() -> list[tuple[str, Callable[[World], list[tuple[tuple, dict]]], Callable[..., bool]]]:
    from billing.budgets import may_set_budget

    tier = QuotaRequest.Approver
    return [
        ("tenants.may_view_tenant", lambda w: [((t,), {}) for t in w.tenant.values()], tenants_policy.may_view_tenant),
        ("tenants.may_change_tenant", lambda w: [((t,), {}) for t in w.tenant.values()], tenants_policy.may_change_tenant),
        ("tenants.may_manage_members", lambda w: [((t,), {}) for t in w.tenant.values()],
         tenants_policy.may_manage_members),
        ("tenants.may_view_project", lambda w: [((p,), {}) for p in w.projects()], tenants_policy.may_view_project),
        ("tenants.may_change_project", lambda w: [((p,), {}) for p in w.projects()], tenants_policy.may_change_project),
        ("tenants.may_submit", lambda w: [((p,), {}) for p in w.projects()], tenants_policy.may_submit),
        ("tenants.may_approve", lambda w: [((p,), {}) for p in w.projects()], tenants_policy.may_approve),
        ("workloads.may_decide", lambda w: [((p,), {}) for p in w.projects()], workloads_policy.may_decide),
        ("quotas.may_decide", lambda w: [((q,), {"tier": t}) for q in w.quota_requests() for t in tier.values],
         quotas_policy.may_decide),
        ("insights.may_view_metrics", lambda w: [((t,), {}) for t in w.tenant.values()], insights_policy.may_view_metrics),
        ("maintenance.may_decide_mig_change", lambda w: [((c,), {}) for c in w.mig_change.values()],
         maintenance_policy.may_decide_mig_change),
        ("billing.may_set_budget", lambda w: [((t, None), {}) for t in w.tenant.values()]
         + [((p.tenant, p), {}) for p in w.projects()], may_set_budget),
    ]


def _twin_world(cast: Any) -> World:
    from django.contrib.auth.models import Group

    from tenants.models import Role

    from .factories import UserFactory, make_member

    world = World(cast)
    world.quota_request["own"] = QuotaRequest.objects.create(
        project=cast.vision, flavor=world.quota_request["home"].flavor, resource="nvidia.com/gpu", amount=Decimal(1),
        reason="mine", requested_by=cast.bob, approver=QuotaRequest.Approver.PROJECT_ADMIN)
    world.quota_request["by_admin"] = QuotaRequest.objects.create(
        project=cast.vision, flavor=world.quota_request["home"].flavor, resource="nvidia.com/gpu", amount=Decimal(1),
        reason="mine too", requested_by=cast.alice, approver=QuotaRequest.Approver.PROJECT_ADMIN)
    world.extra = {
        "root": UserFactory(username="root", is_superuser=True),
        "gone": UserFactory(username="gone", is_active=False),
        "unstaffed": UserFactory(username="unstaffed"),
    }
    make_member(world.extra["gone"], cast.acme, Role.TENANT_ADMIN)
    group, _ = Group.objects.get_or_create(name="ops")
    world.extra["unstaffed"].groups.add(group)  # in the ops group but not staff: not ops
    world.projects = lambda: [cast.vision, cast.nlp, cast.llm]
    world.quota_requests = lambda: list(world.quota_request.values())
    return world


@pytest.mark.parametrize("row", range(12), ids=lambda i: ["tenants.may_view_tenant", "tenants.may_change_tenant",
                         "tenants.may_manage_members", "tenants.may_view_project", "tenants.may_change_project",
                         "tenants.may_submit", "tenants.may_approve", "workloads.may_decide", "quotas.may_decide",
                         "insights.may_view_metrics", "maintenance.may_decide_mig_change", "billing.may_set_budget"][i])
def test_holders_twin_agrees_with_its_predicate(cast, row: int) -> None:
    from tenants.access import Actor
    from tenants.policy import holders

    name, objects_of, may = _twins()[row]
    world = _twin_world(cast)
    users = [getattr(cast, who) for who in ("ops", "alice", "bob", "carol", "dave", "erin", "frank", "nobody")]
    users += list(world.extra.values())
    asked = 0
    for objects, options in objects_of(world):
        held = set(holders(may, *objects, **options).values_list("pk", flat=True))
        by_name = set(holders(name, *objects, **options).values_list("pk", flat=True)) if "budget" not in name else held
        assert by_name == held
        for user in users:
            user.__dict__.pop("_portal_is_ops", None)
            allowed = may(Actor(user=user), *objects, **options)
            assert allowed == (user.pk in held), f"{name}{objects}{options}: {user.username} predicate={allowed}"
            asked += 1
    assert asked >= 22


def test_the_requester_is_not_told_to_decide_their_own_quota_request(cast) -> None:
    """``quotas.may_decide`` refuses bob on his own request (project tier); so do its holders and who is told."""
    from quotas.selectors import quota_request_approvers
    from tenants.access import Actor
    from tenants.policy import holders

    world = _twin_world(cast)
    own = world.quota_request["own"]
    tier = QuotaRequest.Approver.PROJECT_ADMIN
    assert not quotas_policy.may_decide(Actor(user=cast.bob), own, tier=tier)
    assert not holders(quotas_policy.may_decide, own, tier=tier).filter(pk=cast.bob.pk).exists()
    assert [u.username for u in quota_request_approvers(request=own)] == ["alice"]
    # carol's request: bob and alice decide and are told; ops only where nobody else may.
    assert [u.username for u in quota_request_approvers(request=world.quota_request["home"])] == ["alice", "bob"]
    ops_tier = QuotaRequest.objects.create(project=cast.vision, flavor=own.flavor, resource="nvidia.com/gpu",
                                           amount=Decimal(1), reason="ops", requested_by=cast.carol,
                                           approver=QuotaRequest.Approver.OPS)
    assert [u.username for u in quota_request_approvers(request=ops_tier)] == ["ops", "root"]


def test_ops_is_one_rule_for_one_user_a_queryset_and_the_session(cast) -> None:
    """``is_ops``, ``ops_users()``, the session's user query and the ops user list (``in_ops_group``) all come from
    ``tenants.access.ops_q``: they agree for ops, a superuser, a disabled ops user and a non-staff group member."""
    from tenants.access import Actor, is_ops, ops_users, user_for_session
    from tenants.selectors import user_list_for

    world = _twin_world(cast)
    gone_ops = world.extra["gone"]
    gone_ops.is_staff = True
    gone_ops.save(update_fields=["is_staff"])
    gone_ops.groups.add(*world.extra["unstaffed"].groups.all())
    users = [cast.ops, cast.alice, cast.nobody, *world.extra.values()]
    listed = {u.pk: u.in_ops_group for u in user_list_for(actor=Actor(user=cast.ops))}
    held = set(ops_users().values_list("pk", flat=True))
    for user in users:
        user.__dict__.pop("_portal_is_ops", None)
        session = user_for_session(user.pk)
        assert is_ops(user) == (user.pk in held) == is_ops(session), user.username
    assert {u.username for u in users if u.pk in held} == {"ops", "root"}
    # The users page's toggle: the ops role as held, whether or not the account is active now.
    assert {u.username for u in users if listed[u.pk]} == {"ops", "root", "gone"}
