"""Deploy checks (``manage.py check --deploy``) for what tenants sends: invitation and notification mail.

Without ``EMAIL_HOST`` the settings pick Django's console backend, which prints every message, invitation
links (sign-up credentials in all but name) included, to the process's stdout and so into the log pipeline.
That is right for ``make run`` and wrong anywhere else: with ``PORTAL_ENV=production`` it is an error.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register

# Backends that do not deliver: they print or keep the messages (and their links) instead.
UNDELIVERED = {
    "django.core.mail.backends.console.EmailBackend",
    "django.core.mail.backends.filebased.EmailBackend",
    "django.core.mail.backends.locmem.EmailBackend",
    "django.core.mail.backends.dummy.EmailBackend",
}


@register(Tags.security, deploy=True)
def mail_is_delivered(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    if getattr(settings, "PORTAL_ENV", "") != "production" or settings.EMAIL_BACKEND not in UNDELIVERED:
        return []
    return [Error(
        f"Production sends mail through {settings.EMAIL_BACKEND.rsplit('.', 2)[-2]} backend, which prints or keeps "
        "every message (invitation links included) instead of delivering it.",
        hint="Set EMAIL_HOST (and EMAIL_PORT, EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS) to your SMTP relay.",
        id="tenants.E001",
    )]
