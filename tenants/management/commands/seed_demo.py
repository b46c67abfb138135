from django.core.management.base import BaseCommand

from tenants.demo import DEMO_PASSWORD, seed_demo


class Command(BaseCommand):
    help = "Create the demo tenants, projects and users (idempotent) and print the logins."

    def handle(self, *args, **options) -> None:  # noqa: ANN002, ANN003
        logins = seed_demo()
        from quotas.demo import seed_quota_demo

        seed_quota_demo()
        from workloads.catalogue import seed_catalogue

        seed_catalogue()
        from workloads.demo import seed_request_demo

        seed_request_demo()
        self.stdout.write(self.style.SUCCESS("Demo logins (password for all: %s):" % DEMO_PASSWORD))
        for username, what in logins:
            self.stdout.write(f"  {username:<7} {what}")
