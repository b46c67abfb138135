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
    ("workloads.may_ask_extension", lambda a, w, x: workloads_policy.may_ask_extension(a, w.request[x]), {"carol"}, NONE),
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
