from django.apps import AppConfig


class InsightsConfig(AppConfig):
    """The platform's acceptance metrics, reports and the architecture review (docs/insights.md)."""

    name = "insights"
