"""Domain errors. Services raise these; the API handler and the views turn them into responses."""

from __future__ import annotations

from rest_framework import exceptions, status


class PortalError(Exception):
    status_code = status.HTTP_400_BAD_REQUEST
    code = "error"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field

    def as_api_exception(self) -> exceptions.APIException:
        if self.field:
            exc = exceptions.ValidationError({self.field: [self.message]})
            exc.status_code = self.status_code
            return exc
        exc = exceptions.APIException(self.message, code=self.code)
        exc.status_code = self.status_code
        return exc


class NotAllowed(PortalError):
    """The actor may see the object but not do this to it."""

    status_code = status.HTTP_403_FORBIDDEN
    code = "permission_denied"


class ReadOnlyTenant(NotAllowed):
    """The tenant is suspended: its users may read but not change anything."""

    code = "tenant_suspended"


class Invalid(PortalError):
    status_code = status.HTTP_400_BAD_REQUEST
    code = "invalid"


class ConflictError(PortalError):
    status_code = status.HTTP_409_CONFLICT
    code = "conflict"


class ExtensionUnavailable(PortalError):
    """An enforcing extension (``portal.extensions``, e.g. the budget guard) failed: what it guards is refused."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    code = "unavailable"

    def as_api_exception(self) -> exceptions.APIException:
        # Not a validation error: the API answers 503 {"error": "unavailable", "detail": ...}; the field only
        # places the message on a page's form.
        exc = exceptions.APIException(self.message, code=self.code)
        exc.status_code = self.status_code
        return exc


class IdempotencyKeyReused(PortalError):
    """An Idempotency-Key sent again with a different request body: a client bug, not a retry."""

    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    code = "idempotency_key_reused"
