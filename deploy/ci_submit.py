#!/usr/bin/env python3
"""Submit a training job to the GPU portal from a CI pipeline and wait for it. Standard library only.

    export PORTAL_URL=https://gpu.example.org PORTAL_TOKEN=gpp_...   # a project token, scope "read and submit"
    python3 deploy/ci_submit.py --command "python train.py" --arg=--epochs --arg=3 --gpus 1

It POSTs to ``/api/v1/requests/`` with an ``Idempotency-Key`` (``--key``; by default derived from the CI
job's id, so a retried pipeline step finds its first request instead of making a second one), then polls
``/api/v1/requests/<id>/`` with ``If-None-Match`` (an unchanged request costs a 304), slowing down while
nothing changes, and prints every change of state with the portal's answer to "why is it pending?".

Exit status: 0 when the request reached ``--until`` (by default: it succeeded), 1 when it ended any
other way (failed, rejected, cancelled, stopped, expired), 2 when the portal refused it (the errors are
printed), 3 on timeout, 4 when the portal could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

FINAL = {"succeeded", "failed", "stopped", "rejected", "cancelled", "expired"}
# CI systems' job ids: a re-run of the same job reuses the key, a new pipeline gets a new one.
CI_IDS = ("CI_JOB_ID", "GITHUB_RUN_ID", "BUILD_TAG", "BUILDKITE_JOB_ID", "CIRCLE_WORKFLOW_JOB_ID")
MAX_INTERVAL = 60.0


class Refused(Exception):
    """The portal answered 4xx: retrying the same request cannot help."""


def call(method: str, url: str, token: str, *, body: Any = None, headers: dict[str, str] | None = None,
         retries: int = 5) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
    """One API call; network errors and 5xx are retried with backoff (safe: the POST carries a key)."""
    data = json.dumps(body).encode() if body is not None else None
    all_headers = {"Authorization": f"Bearer {token}", "Accept": "application/json", **(headers or {})}
    if data is not None:
        all_headers["Content-Type"] = "application/json"
    delay = 1.0
    for attempt in range(retries + 1):
        request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None, {k.lower(): v for k, v in response.headers.items()}
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                return 304, None, {k.lower(): v for k, v in exc.headers.items()}
            raw = exc.read()
            if exc.code < 500 and exc.code != 429:
                try:
                    payload = json.loads(raw)
                except ValueError:
                    payload = {"detail": raw.decode("utf-8", "replace")}
                raise Refused(describe_error(exc.code, payload)) from None
            problem = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            problem = str(getattr(exc, "reason", exc))
        if attempt == retries:
            raise ConnectionError(f"{method} {url}: {problem}")
        print(f"portal: {problem}; retrying in {delay:.0f}s", file=sys.stderr)
        time.sleep(delay)
        delay = min(delay * 2, 30)
    raise AssertionError("unreachable")


def describe_error(status: int, payload: dict[str, Any]) -> str:
    lines = [f"HTTP {status}: {payload.get('detail') or payload.get('error') or 'refused'}"]
    for field, messages in sorted((payload.get("fields") or {}).items()):
        for message in messages if isinstance(messages, list) else [messages]:
            lines.append(f"  {field}: {message}")
    return "\n".join(lines)


def default_key() -> str:
    for name in CI_IDS:
        if os.environ.get(name):
            return f"ci-{name.lower()}-{os.environ[name]}-{os.environ.get('GITHUB_RUN_ATTEMPT', '')}".rstrip("-")
    return f"ci-{uuid.uuid4()}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("PORTAL_URL", "http://127.0.0.1:8000"), help="portal base URL ($PORTAL_URL)")
    parser.add_argument("--template", default="training", help="template slug (default: training)")
    parser.add_argument("--project", help="project slug (default: the token's project)")
    parser.add_argument("--command", required=True, help="what to run, e.g. 'python train.py'")
    parser.add_argument("--arg", action="append", default=[], help="an argument (repeat; write --arg=--flag for ones starting with -)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="an environment variable (repeat)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=JSON", help="any other parameter, e.g. retries=2")
    parser.add_argument("--flavor", help="flavor name (default: the template's first)")
    parser.add_argument("--gpus", type=int)
    parser.add_argument("--image", help="image reference (default: the first curated one)")
    parser.add_argument("--duration-hours", type=int)
    parser.add_argument("--name", help="request name (default: made up)")
    parser.add_argument("--key", default=None, help="Idempotency-Key (default: from the CI job id)")
    parser.add_argument("--until", default="succeeded",
                        help="comma-separated states that count as done (default: succeeded); other final states fail")
    parser.add_argument("--timeout", type=float, default=6 * 3600, help="seconds to wait in all (default 6 h)")
    parser.add_argument("--interval", type=float, default=10, help="first polling interval in seconds (default 10)")
    return parser.parse_args(argv)


def request_body(args: argparse.Namespace) -> dict[str, Any]:
    parameters: dict[str, Any] = {"command": args.command}
    if args.arg:
        parameters["args"] = args.arg
    if args.env:
        parameters["env"] = dict(item.split("=", 1) for item in args.env)
    for item in args.param:
        name, _, value = item.partition("=")
        try:
            parameters[name] = json.loads(value)
        except ValueError:
            parameters[name] = value
    body: dict[str, Any] = {"template": args.template, "parameters": parameters}
    for field in ("project", "flavor", "gpus", "image", "duration_hours", "name"):
        value = getattr(args, field)
        if value is not None:
            body[field] = value
    return body


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    token = os.environ.get("PORTAL_TOKEN", "")
    if not token:
        print("Set PORTAL_TOKEN to a project token with the 'read and submit' scope.", file=sys.stderr)
        return 2
    base = args.url.rstrip("/") + "/api/v1/requests/"
    key = args.key or default_key()
    until = {s.strip() for s in args.until.split(",") if s.strip()}

    try:
        status, req, _ = call("POST", base, token, body=request_body(args), headers={"Idempotency-Key": key})
    except Refused as exc:
        print(f"The portal refused the request:\n{exc}", file=sys.stderr)
        return 2
    except ConnectionError as exc:
        print(f"Could not reach the portal: {exc}", file=sys.stderr)
        return 4
    assert req is not None
    what = "already submitted (same Idempotency-Key)" if status == 200 else "submitted"
    print(f"request {req['id']} ({req['project']}/{req['name']}) {what}; key {key}", flush=True)

    url, etag, last, last_why = f"{base}{req['id']}/", "", "", ""
    interval, deadline = args.interval, time.monotonic() + args.timeout
    while True:
        why = req.get("pending_reason") or ""
        if (req["state"], why) != (last, last_why):
            last, last_why = req["state"], why
            print(f"state: {last}" + (f" — {why}" if why else ""), flush=True)
            interval = args.interval  # something moves: look again soon
        if last in until:
            print(json.dumps({"id": req["id"], "state": last, "cost": req.get("cost_estimate")}), flush=True)
            return 0
        if last in FINAL:
            print(f"ended {last}: {req.get('state_reason') or ''}".rstrip(": "), file=sys.stderr)
            print(json.dumps({"id": req["id"], "state": last, "cost": req.get("cost_estimate")}), flush=True)
            return 1
        if time.monotonic() + interval > deadline:
            print(f"timed out waiting; request {req['id']} is {last}", file=sys.stderr)
            return 3
        time.sleep(interval)
        try:
            status, body, headers = call("GET", url, token, headers={"If-None-Match": etag} if etag else None)
        except (Refused, ConnectionError) as exc:
            print(f"Lost the request: {exc}", file=sys.stderr)
            return 4
        etag = headers.get("etag", etag)
        if status == 304 or body is None:
            interval = min(interval * 1.5, MAX_INTERVAL)  # nothing changed: no polling storm
            continue
        req = body


if __name__ == "__main__":
    sys.exit(main())
