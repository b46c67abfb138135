"""API token authentication: ``Authorization: Bearer gpp_<prefix>_<secret>``."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from portal.compiled import Compiled

from .access import token_memberships, token_memberships_read
from .models import ApiToken

TOKEN_PREFIX = "gpp"
# ``last_used_at`` is written at most this often per token: it tells people whether a token is still in use,
# and an UPDATE on every GET costed the token list a sixth of its time (docs/performance.md).
LAST_USED_PRECISION = timedelta(seconds=60)


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_generate() -> tuple[str, str, str]:
    """A new token: (raw secret shown once, its public prefix, the hash we store)."""
    prefix = secrets.token_hex(4)
    raw = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    return raw, prefix, token_hash(raw)


# With its user's memberships in its tenant: the token's permissions then ask no query (access._token_scope).
# Compiled once per process (portal.compiled): building and compiling it took longer than running it.
_TOKEN_BY_PREFIX = Compiled(
    lambda prefix: ApiToken.objects.select_related("user", "project__tenant")
    .annotate(memberships_here=token_memberships()).filter(prefix=prefix)
)


def token_resolve(raw: str) -> ApiToken:
    """The live token for ``raw``, or AuthenticationFailed (401) for anything else."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise exceptions.AuthenticationFailed("Invalid token.")
    found = _TOKEN_BY_PREFIX.rows(parts[1])  # the prefix is unique
    if not found:
        raise exceptions.AuthenticationFailed("Invalid token.")
    token = found[0]
    token_memberships_read(token)
    if not hmac.compare_digest(token.secret_hash, token_hash(raw)):
        raise exceptions.AuthenticationFailed("Invalid token.")
    now = timezone.now()
    if token.revoked_at is not None:
        raise exceptions.AuthenticationFailed("Token revoked.")
    if token.expires_at <= now:
        raise exceptions.AuthenticationFailed("Token expired.")
    if not token.user.is_active:
        raise exceptions.AuthenticationFailed("User inactive.")
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_PRECISION:
        # Filtered on the value read, so of concurrent calls only one writes (the others update no row).
        stale = ApiToken.objects.filter(pk=token.pk)
        stale = (stale.filter(last_used_at__isnull=True) if token.last_used_at is None
                 else stale.filter(last_used_at__lte=now - LAST_USED_PRECISION))
        stale.update(last_used_at=now)
        token.last_used_at = now
    return token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace").split()
        if not header or header[0].lower() not in ("bearer", "token"):
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid Authorization header.")
        token = token_resolve(header[1])
        return token.user, token

    def authenticate_header(self, request) -> str:
        return self.keyword


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI schema's name for project tokens: HTTP bearer authentication."""

    target_class = ApiTokenAuthentication
    name = "projectToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "gpp_<prefix>_<secret>",
                "description": "A project token (POST /api/v1/tokens/); the secret is shown once."}
