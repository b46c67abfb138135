"""Django's ``cached_db`` sessions, read together with the request's cache versions (``SESSION_ENGINE`` with Redis).

A signed-in request's first cache read is its session; the versions of ``portal.cache`` (the kept tables, the
approvers' counts, the price list) come next, in a round trip of their own. Here the session's load fetches both in
one ``get_many``: a signed-in page or API call costs one Redis round trip before its own work, not two. Everything
else is Django's: the session is written to the database and the cache, read from the database when the cache lost
it, and a missing version is made by its first lookup as before.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.sessions.backends.cached_db import SessionStore as CachedDbStore

from . import cache as kept


class SessionStore(CachedDbStore):
    def load(self) -> dict[str, Any]:
        versions = kept.versions_to_read() if settings.SESSION_CACHE_ALIAS == "default" else []
        if not versions:
            return super().load()
        key = self.cache_key
        try:
            got = self._cache.get_many([key, *versions])
        except Exception:  # as Django's: a key the backend refuses resets the session
            got = {}
        kept.versions_read(got)
        data = got.get(key)
        if data is None:
            row = self._get_session_from_db()
            if row is None:
                return {}
            data = self.decode(row.session_data)
            self._cache.set(key, data, self.get_expiry_age(expiry=row.expire_date))
        return data
