from django.apps import AppConfig


class InsightsConfig(AppConfig):
    """The platform's acceptance metrics, reports and the architecture review (docs/insights.md)."""

    name = "insights"

    def ready(self) -> None:
        # Each metric family registers its metrics (insights/registry.py: METRICS) when imported.
        from . import cost, efficiency, fairness, scheduling  # noqa: F401
