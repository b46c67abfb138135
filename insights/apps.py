from django.apps import AppConfig


class InsightsConfig(AppConfig):
    """The platform's acceptance metrics, reports and the architecture review (docs/insights.md)."""

    name = "insights"

    def ready(self) -> None:
        from tenants.policy import predicates_install

        from . import digests, policy  # noqa: F401 (digests registers the task insights.digests_send)

        predicates_install(policy)  # templates ask them by name ({% may "insights.may_view_metrics" tenant as ok %})
        # Each metric family registers its metrics (insights/registry.py: METRICS) when imported.
        from . import cost, efficiency, fairness, reclaim, scheduling  # noqa: F401
