"""API rate limits: DRF throttles that read their rates from settings at each request.

Kept apart from portal/api.py on purpose: DRF imports ``DEFAULT_THROTTLE_CLASSES`` while it builds
``APIView``, so this module must not import ``rest_framework.views`` (or anything that does), or the
first import of the API plumbing becomes circular.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import throttling

# Counted in the cache per API token when a token authenticates, else per user. The rates are read
# from settings at each request (API_RATE_USER, API_RATE_SUBMIT), so a test or an operator's override
# applies at once; an empty rate means no limit. A throttled request answers 429 with Retry-After.


class _SettingsRateThrottle(throttling.SimpleRateThrottle):
    setting = ""

    def __init__(self) -> None:  # the rate is read per request, not when the class is made
        pass

    def get_rate(self) -> str | None:
        return getattr(settings, self.setting, None) or None

    def allow_request(self, request: Any, view: Any) -> bool:
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None  # refused with 401/403 before anything else
        token = request.auth if getattr(request.auth, "pk", None) is not None else None
        ident = f"token-{token.pk}" if token is not None else f"user-{user.pk}"
        return f"throttle_{self.scope}_{ident}"


class UserRateThrottle(_SettingsRateThrottle):
    """Every API call: API_RATE_USER per token or user."""

    scope = "user"
    setting = "API_RATE_USER"


class SubmitRateThrottle(_SettingsRateThrottle):
    """Submissions (POST /api/v1/requests/), on top of the user's rate: API_RATE_SUBMIT per token or user."""

    scope = "submit"
    setting = "API_RATE_SUBMIT"
