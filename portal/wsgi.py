import os

from django.core.wsgi import get_wsgi_application

from portal import gc_pacing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_wsgi_application()
# Startup's objects out of the collector's sight, collections between requests, not in them (portal/gc_pacing.py).
gc_pacing.start_web_worker()
