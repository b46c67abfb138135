"""Paths that the portal forwards to a cluster on a user's behalf (the notebook proxy, the ingress's auth check).

A path a browser sends is never trusted to stay where it was aimed: ``/notebooks/2/../../api/v1/secrets`` is a
dot-segment walk that an HTTP client (urllib3) or the server on the other side (the Kubernetes API server) removes
before routing, which would turn "a file in my notebook" into "any path of the Kubernetes API, with the portal's
credentials". So a forwarded path is

- **refused** when any of its segments is ``.`` or ``..`` (also as ``..;param``, with surrounding blanks, in any
  case of its percent-encoding, encoded twice), or it holds a backslash, an encoded slash or backslash, a control
  character, or a percent escape that is still there after the server decoded the path once (double encoding,
  or bytes that are not UTF-8);
- **rebuilt** segment by segment with every character outside the unreserved set percent-encoded, so nothing in it
  can be read as a separator, a parameter or a dot segment by whatever parses it next; and
- **checked** once built, as the HTTP client will send it (urllib3's own parser), to lie under the prefix it was
  meant for (:func:`under_prefix`).

Pure functions: no Django, no cluster.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

# A percent escape of any byte; ``%2e`` and ``%2E`` alike.
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
# Escapes that smuggle a separator past a server that decodes once: ``/`` and ``\``.
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
# What a rebuilt segment keeps as is (RFC 3986 unreserved characters and a few sub-delimiters that no server in
# the path treats specially); ``;`` (path parameters), ``%``, ``/``, ``\``, ``?`` and ``#`` are always encoded.
_SEGMENT_SAFE = "-_.~!$&'()*+,=@:"


class PathRefused(ValueError):
    """A forwarded path that could leave the place it was aimed at."""


def _dot_segment(segment: str) -> bool:
    bare = segment.split(";", 1)[0].strip().strip("\x00")
    return bare in (".", "..")


def refusal(path: str, *, decoded: bool) -> str | None:
    """Why ``path`` may not be forwarded, or None.

    ``decoded``: the path as a WSGI server hands it over (``PATH_INFO``, decoded once); otherwise the raw request
    target as sent (nginx's ``$request_uri``, ``X-Original-URI``), which is decoded here, up to three times, and
    every form is checked."""
    forms = [path]
    if not decoded:
        if _ENCODED_SEPARATOR.search(path):
            return "an encoded slash or backslash"
        current = path
        for _ in range(3):
            try:
                nxt = unquote(current, errors="strict") if _ESCAPE.search(current) else current
            except UnicodeDecodeError:
                return "a percent escape that is not UTF-8"
            if nxt == current:
                break
            forms.append(nxt)
            current = nxt
        else:
            if _ESCAPE.search(current):
                return "a path encoded more than three times"
    for form in forms:
        if "\\" in form:
            return "a backslash"
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in form):
            return "a control character"
        if any(_dot_segment(s) for s in form.split("/")):
            return "a '.' or '..' segment"
        if decoded and _ESCAPE.search(form):
            # PATH_INFO is decoded already: an escape left in it was encoded twice (``%252e%252e``) or is a byte
            # that is not UTF-8 (``%c0%ae``, which Django leaves encoded).
            return "a percent escape left after decoding (encoded twice, or not UTF-8)"
    return None


def rebuilt(path: str) -> str:
    """``path`` (decoded, already passed :func:`refusal`) with each segment percent-encoded on its own."""
    if refusal(path, decoded=True) is not None:
        raise PathRefused(refusal(path, decoded=True))
    return "/".join(quote(segment, safe=_SEGMENT_SAFE) for segment in path.split("/"))


def under_prefix(url_path: str, prefix: str) -> bool:
    """Whether ``url_path`` lies under ``prefix`` as the HTTP client will send it: urllib3 parses the URL it is
    given and removes dot segments, so the check runs on its parse, and the parse must not have changed it."""
    from urllib3.util import parse_url

    if not prefix.endswith("/"):
        prefix += "/"
    sent = parse_url("http://cluster" + url_path).path or "/"
    if sent != url_path or not sent.startswith(prefix):
        return False
    tail = sent[len(prefix):]
    return not any(_dot_segment(unquote(s)) for s in tail.split("/")) and "%2f" not in tail.lower() \
        and "%5c" not in tail.lower()
