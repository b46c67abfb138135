"""``manage.py seed_demo``: the whole demo (tenants, users, the sandbox cluster's quotas, the catalogue
a price list and a budget, some requests, and three weeks of history for the metrics and cost charts). It lives in
insights, the highest app it needs, so that every import points down (tests/test_imports.py)."""

from django.core.management.base import BaseCommand

from billing.demo import seed_billing_demo
from insights.demo import seed_insights_demo
from quotas.demo import seed_quota_demo, seed_zone_demo
from tenants.demo import DEMO_PASSWORD, seed_demo
from workloads.catalogue import seed_catalogue
from workloads.demo import seed_request_demo, seed_zone_templates


class Command(BaseCommand):
    help = "Create the demo tenants, projects and users (idempotent) and print the logins."

    def handle(self, *args, **options) -> None:
        logins = seed_demo()
        seed_quota_demo()
        seed_zone_demo()  # the A100 and L40S zones next to the H100 one (docs/federation.md)
        seed_catalogue()
        seed_zone_templates()
        seed_billing_demo()
        seed_request_demo()
        seed_insights_demo()  # three weeks of past requests, samples and usage (insights/demo.py)
        self.stdout.write(self.style.SUCCESS(f"Demo logins (password for all: {DEMO_PASSWORD}):"))
        for username, what in logins:
            self.stdout.write(f"  {username:<7} {what}")
