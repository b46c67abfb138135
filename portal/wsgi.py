import gc
import os

from django.core.wsgi import get_wsgi_application

from portal import gc_pacing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_wsgi_application()


def _freeze_startup_objects() -> None:
    """Load the URLconf (every view module) now, then move what startup made out of the collector's sight
    (``gc.freeze``): Django, the apps and their modules live as long as the worker, yet each full collection
    walked them all (about 180,000 objects, 200-300 ms on the bench machine, once every hundred-odd pages: the
    pages' p95). Garbage made by requests is collected as before (docs/performance.md)."""
    from django.urls import get_resolver

    len(get_resolver().url_patterns)  # imports the views, forms and serializers
    gc.collect()
    gc.freeze()


_freeze_startup_objects()
gc_pacing.install()  # collections between requests, not in them (portal/gc_pacing.py)
