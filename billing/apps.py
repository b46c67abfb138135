from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from django.core.signals import request_started

        from portal import rollups
        from portal.extensions import budget_remaining, cost_estimator, cost_so_far, submission_guard, usage_meter
        from tenants.policy import predicates_install

        from . import budgets, metering, policy, rollup, selectors

        predicates_install(policy)  # templates ask them by name ({% may "billing.may_manage_prices" as ok %})
        # The lower apps reach billing only through these slots (docs/billing.md).
        cost_estimator.register(selectors.estimate, currency=selectors.currency())
        cost_so_far.register(selectors.request_cost_so_far, currency=selectors.currency())
        usage_meter.register(metering.meter_observe)
        submission_guard.register(budgets.submission_guard)  # also registers the beat task billing.budgets_check
        budget_remaining.register(budgets.budget_remaining)
        # The daily cost rollup, refreshed and backfilled through the one rollup seam (portal/rollups.py).
        rollups.register(rollups.Rollup(name="costs", owner="billing.rollup", grain="day", refresh=rollup.refresh,
                                        backfill=rollup.backfill, mark=rollup.mark_changed))
        request_started.connect(selectors.request_started, dispatch_uid="billing-price-list-version")
