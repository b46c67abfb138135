from django.http import HttpRequest

from .access import is_ops


def portal(request: HttpRequest) -> dict:
    """Navigation facts every page needs."""
    user = getattr(request, "user", None)
    return {"is_ops": is_ops(user) if user is not None else False}
