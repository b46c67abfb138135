"""HTTP to the portal's REST API and the client's configuration file. Standard library only, no Django.

The exit statuses every command shares live here: :class:`Refused` (the portal answered 4xx, retrying
cannot help: exit 2) and :class:`Unreachable` (network errors and 5xx, after retries: exit 4).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Exit statuses (shared by every command; `wait` adds 1 and 3).
EXIT_OK, EXIT_ENDED, EXIT_REFUSED, EXIT_TIMEOUT, EXIT_UNREACHABLE = 0, 1, 2, 3, 4

# The request states (workloads.models.RequestState); the client cannot import the portal.
STATES = ("submitted", "pending_approval", "approved", "queued", "running", "succeeded", "failed", "stopped",
          "rejected", "cancelled", "expired", "preempted")
FINAL = frozenset({"succeeded", "failed", "stopped", "rejected", "cancelled", "expired"})

# CI systems' job ids: a re-run of the same job reuses the key, a new pipeline gets a new one.
CI_IDS = ("CI_JOB_ID", "GITHUB_RUN_ID", "BUILD_TAG", "BUILDKITE_JOB_ID", "CIRCLE_WORKFLOW_JOB_ID")


class CliError(Exception):
    exit_code = EXIT_REFUSED


class NotConfigured(CliError):
    """No portal URL or token: neither in the environment nor in the config file."""


class Refused(CliError):
    """The portal answered 4xx: retrying the same call cannot help."""

    def __init__(self, status: int, payload: dict[str, Any]):
        self.status = status
        self.payload = payload
        super().__init__(describe_error(status, payload))

    @property
    def fields(self) -> dict[str, list[str]]:
        return flatten_fields(self.payload.get("fields") or {})


class Unreachable(CliError):
    exit_code = EXIT_UNREACHABLE


def flatten_fields(fields: Any, prefix: str = "") -> dict[str, list[str]]:
    """``{"parameters": {"retries": ["..."]}}`` → ``{"parameters.retries": ["..."]}``."""
    out: dict[str, list[str]] = {}
    if isinstance(fields, dict):
        for name, value in fields.items():
            out.update(flatten_fields(value, f"{prefix}.{name}" if prefix else str(name)))
    elif isinstance(fields, list) and fields and all(isinstance(m, (dict, list)) for m in fields):
        for index, value in enumerate(fields):
            out.update(flatten_fields(value, f"{prefix}[{index}]"))
    else:
        messages = fields if isinstance(fields, list) else [fields]
        out[prefix or "non_field_errors"] = [str(m) for m in messages]
    return out


def describe_error(status: int, payload: dict[str, Any]) -> str:
    """The API's error shape ``{"error", "detail", "fields"}`` as readable lines."""
    code = payload.get("error") or ""
    lines = [f"HTTP {status}" + (f" {code}" if code else "") + f": {payload.get('detail') or 'refused'}"]
    for field, messages in sorted(flatten_fields(payload.get("fields") or {}).items()):
        for message in messages:
            lines.append(f"  {field}: {message}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- configuration
def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuportal" / "config.json"


def config_read() -> dict[str, str]:
    try:
        data = json.loads(config_path().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise NotConfigured(f"Cannot read {config_path()}: {exc}") from None
    return data if isinstance(data, dict) else {}


def config_write(url: str, token: str) -> Path:
    """Write url + token to the config file, readable by its owner only (0600; its folder 0700)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode on open: make sure
        os.write(fd, (json.dumps({"url": url, "token": token}, indent=2) + "\n").encode())
    finally:
        os.close(fd)
    return path


def check_url(url: str, source: str = "the portal URL") -> str:
    """``url`` without a trailing slash; :class:`NotConfigured` (exit 2, no retries) unless it is an http(s) URL
    with a host: ``gpu.example.org`` without its scheme is a configuration error, not a portal that is down."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise NotConfigured(
            f"{source} {url!r} is not a URL the client can use: write it with its scheme, "
            f"e.g. https://{url.strip().split('://')[-1].strip('/') or 'gpu.example.org'} (http:// or https://)."
        )
    return url.strip().rstrip("/")


def settings(url: str | None = None, token: str | None = None) -> tuple[str, str]:
    """(url, token): explicit values, else $PORTAL_URL / $PORTAL_TOKEN, else the config file."""
    stored = config_read()
    source = "--url" if url else "PORTAL_URL" if os.environ.get("PORTAL_URL") else f"the url in {config_path()}"
    url = url or os.environ.get("PORTAL_URL") or stored.get("url") or ""
    token = token or os.environ.get("PORTAL_TOKEN") or stored.get("token") or ""
    if not url or not token:
        raise NotConfigured("Not logged in: run `gpuportal login --url URL` (or set PORTAL_URL and PORTAL_TOKEN).")
    return check_url(url, source), token


def default_key(body: dict[str, Any]) -> str:
    """An Idempotency-Key from the CI job's id and what is submitted: a retried step finds its first request,
    a second, different submission in the same job gets its own. Outside CI: a random key."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    for name in CI_IDS:
        if os.environ.get(name):
            attempt = os.environ.get("GITHUB_RUN_ATTEMPT", "")
            return f"ci-{name.lower()}-{os.environ[name]}" + (f"-{attempt}" if attempt else "") + f"-{digest}"
    return f"cli-{uuid.uuid4()}"


# ------------------------------------------------------------------------------------------------------- HTTP
@dataclass
class Response:
    status: int
    data: Any
    headers: dict[str, str]


class Client:
    """One portal: ``call()`` retries network errors and 5xx with backoff, and 429 after the time its
    Retry-After says (at most ``max_retry_after`` seconds; longer: :class:`Unreachable` at once). Retrying is
    safe: submissions carry an Idempotency-Key. Raises :class:`Refused` on other 4xx and :class:`Unreachable`
    when retries run out."""

    def __init__(self, url: str, token: str, *, retries: int = 5, timeout: float = 30, max_delay: float = 30,
                 max_retry_after: float = 120):
        self.url = url.rstrip("/")
        self.token = token
        self.retries = retries
        self.timeout = timeout
        self.max_delay = max_delay
        # A 429 says how long to wait (Retry-After). Longer than this: give up at once rather than hang.
        self.max_retry_after = max_retry_after

    def call(self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None,
             params: dict[str, Any] | list[tuple[str, Any]] | None = None) -> Response:
        url = f"{self.url}{path}"
        if params:
            items = params.items() if isinstance(params, dict) else params
            query = [(k, v) for k, v in items if v is not None and v != ""]
            if query:
                url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        all_headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json",
                       "User-Agent": "gpuportal-cli", **(headers or {})}
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        delay = 1.0
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
            wait: float | None = None  # the portal's Retry-After, when it sent one
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                    return Response(response.status, _json(raw), {k.lower(): v for k, v in response.headers.items()})
            except urllib.error.HTTPError as exc:
                if exc.code == 304:
                    return Response(304, None, {k.lower(): v for k, v in exc.headers.items()})
                raw = exc.read()
                if exc.code < 500 and exc.code != 429:
                    payload = _json(raw)
                    if not isinstance(payload, dict):
                        payload = {"detail": raw.decode("utf-8", "replace")[:500] or exc.reason}
                    raise Refused(exc.code, payload) from None
                problem = f"HTTP {exc.code}"
                if exc.code == 429:
                    problem = "HTTP 429: too many requests"
                    wait = retry_after(exc.headers.get("Retry-After"))
                    if wait is not None and wait > self.max_retry_after:
                        raise Unreachable(
                            f"Rate limited: {method} {url}: the portal asks to wait {wait:.0f}s (Retry-After), more than "
                            f"the {self.max_retry_after:.0f}s this client waits (GPUPORTAL_MAX_RETRY_AFTER). Try again later."
                        ) from None
            except (urllib.error.URLError, OSError) as exc:
                problem = str(getattr(exc, "reason", exc))
            if attempt == self.retries:
                raise Unreachable(f"Could not reach the portal: {method} {url}: {problem}")
            if wait is not None:
                # The portal said when: wait that long (never less than a moment), instead of guessing.
                pause = max(wait, 0.5)
                print(f"portal: {problem}; waiting {pause:.0f}s as its Retry-After asks, then retrying", file=sys.stderr)
            else:
                pause = delay
                print(f"portal: {problem}; retrying in {pause:.0f}s", file=sys.stderr)
                delay = min(delay * 2, self.max_delay)
            time.sleep(pause)
        raise AssertionError("unreachable")

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.call("GET", path, **kwargs).data

    def list(self, path: str, params: dict[str, Any] | list[tuple[str, Any]] | None = None, *,
             limit: int = 500) -> list[dict[str, Any]]:
        """Every item of a paginated list (up to ``limit``), following each page's ``next`` link: page numbers
        on the small lists, a cursor on the large ones (requests); only its query is taken, so the path stays
        this client's (the portal may sit behind a proxy)."""
        items: list[dict[str, Any]] = []
        query = [("page_size", min(limit, 500)), *(params.items() if isinstance(params, dict) else params or [])]
        while len(items) < limit:
            data = self.get(path, params=query)
            if isinstance(data, list):
                return data[:limit]
            items.extend(data.get("results") or [])
            if not data.get("next"):
                break
            query = urllib.parse.parse_qsl(urllib.parse.urlsplit(data["next"]).query, keep_blank_values=True)
        return items[:limit]


def retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header: a number of seconds or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdecimal():
        return float(value)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _json(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None
