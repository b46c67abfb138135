"""Small helpers the browser tests share."""

from __future__ import annotations


def stay(page) -> None:
    """Mark ``page``'s window so a later check can tell that it did not reload, once htmx is ready on it.

    A click right after a navigation can land before the deferred htmx script has wired up the page;
    the browser then sends the form the plain way (a full-page POST and redirect), which works for a
    user but is not the in-place update the tests are about. Waiting for the load event, and for htmx
    to be there, makes those tests check what they mean to.
    """
    page.wait_for_load_state("load")
    page.wait_for_function("() => typeof window.htmx === 'object' && document.readyState === 'complete'")
    page.evaluate("window.__stayed = true")
