from django.apps import AppConfig


class InsightsConfig(AppConfig):
    """The platform's acceptance metrics, reports and the architecture review (docs/insights.md)."""

    name = "insights"

    def ready(self) -> None:
        from portal import rollups
        from tenants.policy import predicates_install

        from . import digests, policy  # noqa: F401 (digests registers the task insights.digests_send)

        predicates_install(policy)  # templates ask them by name ({% may "insights.may_view_metrics" tenant as ok %})
        # Each metric family registers its metrics (insights/registry.py: METRICS) when imported.
        from . import cost, efficiency, fairness, federation, forecast, measured, reclaim, scheduling  # noqa: F401
        # "Clone with the suggestion" on a request's page (workloads asks; docs/measured-use.md).
        from portal.extensions import rightsizing

        rightsizing.register(measured.suggestion)
        # The measured idle share on a tenant's statement, as information (billing asks; docs/measured-use.md).
        from portal.extensions import measured_idle_share

        from . import measured_share

        measured_idle_share.register(measured_share.idle_share)
        # The request and sample rollups, refreshed and backfilled through the one rollup seam (portal/rollups.py).
        from . import rollups as requests, sample_rollups as samples
        rollups.register(rollups.Rollup(name="requests", owner="insights.rollups", grain="day (and week)",
                                        refresh=requests.rollups_refresh, backfill=requests.backfill,
                                        mark=requests.mark_since))
        rollups.register(rollups.Rollup(name="samples", owner="insights.sample_rollups", grain="hour (and day)",
                                        refresh=samples.sample_rollups_refresh, backfill=samples.backfill,
                                        mark=samples.mark_since))
        from . import measured_rollup  # the measured samples per day (docs/measured-use.md, "Rollup")

        rollups.register(rollups.Rollup(name="measured", owner="insights.measured_rollup", grain="UTC day",
                                        refresh=measured_rollup.measured_refresh, backfill=measured_rollup.backfill,
                                        mark=measured_rollup.mark_since))
