"""``manage.py reencrypt_kubeconfigs``: the middle step of a Fernet key rotation (docs/operations.md, "Rotating
keys"): with ``PORTAL_ENCRYPTION_KEY=NEW,OLD`` set, encrypt every stored kubeconfig again with NEW."""

from django.core.management.base import BaseCommand, CommandError

from quotas.services import clusters_kubeconfig_reencrypt


class Command(BaseCommand):
    help = "Encrypt every stored kubeconfig again with the newest PORTAL_ENCRYPTION_KEY (after adding a key)."

    def handle(self, *args, **options) -> None:
        done, unreadable = clusters_kubeconfig_reencrypt()
        self.stdout.write(f"{done} kubeconfig(s) encrypted with the newest key")
        if unreadable:
            raise CommandError("no configured key opens the kubeconfig of: " + ", ".join(unreadable))
