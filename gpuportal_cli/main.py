"""``gpuportal``: the GPU portal from a terminal or a CI pipeline (over the REST API only).

Exit statuses: 0 done (``wait``: the request reached ``--until``), 1 the request ended another way
(failed, rejected, cancelled, stopped, expired), 2 the portal refused (4xx; the errors are printed) or the
client is not configured, 3 ``wait`` timed out, 4 the portal could not be reached (after retries).
"""

from __future__ import annotations

import enum
import getpass
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from .client import (
    EXIT_ENDED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    FINAL,
    STATES,
    CliError,
    Client,
    Refused,
    Unreachable,
    check_url,
    config_path,
    config_write,
    default_key,
    settings,
)

app = typer.Typer(
    name="gpuportal",
    help="The GPU portal from a terminal or a CI pipeline: submit, wait, follow logs, cancel, stop.\n\n"
         "`cancel` withdraws a request that is not running yet; `stop` ends a running one "
         "(`cancel --force` does either).\n\n"
         "Exit statuses: 0 done, 1 the request ended otherwise (failed, rejected, cancelled, stopped, expired), "
         "2 refused by the portal, 3 timed out, 4 portal unreachable.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

MAX_INTERVAL = 60.0


class Output(enum.StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table (readable) or json.")]
RequestId = Annotated[int, typer.Argument(help="The request's id.", show_default=False)]
_state: dict[str, Any] = {"retries": 5, "max_retry_after": 120.0}


@app.callback()
def _main(
    retries: Annotated[int, typer.Option(envvar="GPUPORTAL_RETRIES", min=0,
                                         help="Retries on network errors, 5xx (with backoff) and 429 (after its "
                                              "Retry-After) before exit 4.")] = 5,
    max_retry_after: Annotated[float, typer.Option(envvar="GPUPORTAL_MAX_RETRY_AFTER", min=0,
                                                   help="Longest wait a 429's Retry-After may ask for (seconds); "
                                                        "longer: exit 4 at once.")] = 120.0,
) -> None:
    _state["retries"] = retries
    _state["max_retry_after"] = max_retry_after


def main() -> None:
    app()


# ------------------------------------------------------------------------------------------------------ helpers
def _client(url: str | None = None, token: str | None = None) -> Client:
    url, token = settings(url, token)
    return Client(url, token, retries=_state["retries"], max_retry_after=_state["max_retry_after"])


@contextmanager
def _errors() -> Iterator[None]:
    """Refusals exit 2 with the portal's errors, an unreachable portal exits 4."""
    try:
        yield
    except Refused as exc:
        _err(f"The portal refused: {exc}")
        raise typer.Exit(EXIT_REFUSED) from None
    except CliError as exc:
        _err(str(exc))
        raise typer.Exit(exc.exit_code) from None


def _err(message: str) -> None:
    typer.echo(message, err=True)


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    for row in [headers, *cells]:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _when(value: str | None) -> str:
    return (value or "")[:16].replace("T", " ")


def _parse_param(item: str) -> tuple[str, Any]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise typer.BadParameter(f"{item!r}: write NAME=VALUE (VALUE as JSON, or plain text)", param_hint="--param")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def _until(value: str) -> set[str]:
    states = {s.strip() for s in value.split(",") if s.strip()}
    unknown = sorted(states - set(STATES))
    if unknown or not states:
        raise typer.BadParameter(f"unknown state {', '.join(unknown) or '(none)'}; states: {', '.join(STATES)}",
                                 param_hint="--until")
    return states


# ------------------------------------------------------------------------------------------------------- login
@app.command()
def login(
    url: Annotated[str, typer.Option(help="The portal's base URL, e.g. https://gpu.example.org.", show_default=False)],
    token: Annotated[str | None, typer.Option(
        help="An API token (gpp_...); without it, read from stdin or asked for (hidden).", show_default=False)] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Check a token against the portal (/api/v1/me/) and store URL and token in the config file (mode 0600).

    $PORTAL_URL and $PORTAL_TOKEN, when set, override the file."""
    if token is None:
        token = getpass.getpass("Token: ") if sys.stdin.isatty() else sys.stdin.readline()
    token = token.strip()
    if not token:
        _err("No token given.")
        raise typer.Exit(EXIT_REFUSED)
    with _errors():
        url = check_url(url, "--url")
        me = Client(url, token, retries=_state["retries"], max_retry_after=_state["max_retry_after"]).get("/api/v1/me/")
    path = config_write(url.rstrip("/"), token)
    if output == Output.json:
        _print_json({"config": str(path), "me": me})
        return
    scoped = me.get("token") or {}
    what = f" (token {scoped.get('name')}: project {scoped.get('project')}, scope {scoped.get('scope')})" if scoped else ""
    typer.echo(f"Logged in to {url.rstrip('/')} as {me.get('username')}{what}; saved in {path}")


@app.command()
def logout() -> None:
    """Remove the stored URL and token."""
    path = config_path()
    path.unlink(missing_ok=True)
    typer.echo(f"Removed {path}")


# ------------------------------------------------------------------------------------------------------ submit
def _valid_flavors(client: Client, template: str, project: str | None = None) -> tuple[str, list[str]]:
    """(what, names) of the flavors a submission of ``template`` may name: what the new-request form offers in
    ``project`` (else in any project the token may submit in), as the template's ``allowed_flavors`` says it."""
    where = f" in {project}" if project else ""
    try:
        found = client.get(f"/api/v1/templates/{template}/", params={"project": project} if project else None)
    except CliError:
        return f"valid flavors{where}", []
    return f"valid flavors for {template}{where}", [f["name"] for f in found.get("allowed_flavors") or []]


@app.command()
def submit(
    template: Annotated[str, typer.Argument(help="Template slug (see `gpuportal templates`) or id.", show_default=False)],
    project: Annotated[str | None, typer.Option(help="Project slug (default: the token's project).")] = None,
    flavor: Annotated[str | None, typer.Option(help="Flavor name (default: the template's first; see `gpuportal flavors`).")] = None,
    gpus: Annotated[int | None, typer.Option(min=0, help="GPUs (default: the template's).")] = None,
    share_memory_gib: Annotated[float | None, typer.Option(
        help="HAMi flavors: each vGPU's GPU memory in GiB, at most one card's (default: the flavor's preset share).",
        show_default=False)] = None,
    share_cores_percent: Annotated[int | None, typer.Option(
        help="HAMi flavors: each vGPU's % of the card's cores, 1 to 100 (default: the preset's).",
        show_default=False)] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", metavar="NAME=VALUE",
        help="A template parameter (repeat); VALUE is JSON when it parses, else text: "
             "-p command='python train.py' -p args='[\"--epochs\", \"3\"]' -p retries=2")] = None,
    name: Annotated[str | None, typer.Option(help="Request name (default: made up).")] = None,
    image: Annotated[str | None, typer.Option(help="Image reference (default: the first curated one).")] = None,
    duration_hours: Annotated[int | None, typer.Option(min=1, help="How long it may run.")] = None,
    priority: Annotated[str | None, typer.Option(
        help="interactive, batch or production (inference: production only, its default).")] = None,
    replicas: Annotated[int | None, typer.Option(
        min=1, help="Inference: replicas, the autoscaler's maximum with -p min_replicas=N (N at most this).")] = None,
    accept_model: Annotated[list[str] | None, typer.Option(
        "--accept-model", metavar="MODEL",
        help="A GPU model the job accepts (repeat, preferred first; the first is the flavor's): "
             "--accept-model h100-80gb --accept-model a100-80gb")] = None,
    min_gpu_memory: Annotated[int | None, typer.Option(min=1, help="GiB of GPU memory per GPU the image needs.")] = None,
    min_compute_capability: Annotated[str | None, typer.Option(help="CUDA compute capability the image needs (8.0, 9.0).")] = None,
    spill_consent: Annotated[bool, typer.Option(
        "--spill-consent", help="It may run on a later --accept-model when its first is full (if the project allows).")] = False,
    idempotency_key: Annotated[str | None, typer.Option(
        help="Idempotency-Key (default: from the CI job id and the submission, so a retried step finds its request).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Then wait like `gpuportal wait` (same exit statuses).")] = False,
    until: Annotated[str, typer.Option(help="With --wait: the state(s) that count as done, comma-separated.")] = "succeeded",
    timeout: Annotated[float, typer.Option(help="With --wait: seconds to wait in all.")] = 6 * 3600,
    interval: Annotated[float, typer.Option(envvar="GPUPORTAL_POLL_INTERVAL",
                                            help="With --wait: first polling interval (seconds).")] = 10,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the request's id.")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Submit a request (POST /api/v1/requests/) with an Idempotency-Key; with --wait, wait for it."""
    states = _until(until)
    parameters = dict(_parse_param(item) for item in param or [])
    body: dict[str, Any] = {"template": template, "parameters": parameters}
    for field, value in (("project", project), ("flavor", flavor), ("gpus", gpus), ("name", name), ("image", image),
                         ("duration_hours", duration_hours), ("priority", priority), ("replicas", replicas),
                         ("accepted_models", accept_model),
                         ("min_gpu_memory_gib", min_gpu_memory), ("min_compute_capability", min_compute_capability),
                         ("share_memory_gib", share_memory_gib), ("share_cores_percent", share_cores_percent)):
        if value is not None:
            body[field] = value
    if spill_consent:
        body["spill_consent"] = True
    key = idempotency_key or default_key(body)
    with _errors():
        client = _client()
        try:
            response = client.call("POST", "/api/v1/requests/", body=body, headers={"Idempotency-Key": key})
        except Refused as exc:
            _err(f"The portal refused the request: {exc}")
            if "flavor" in exc.fields:
                what, names = _valid_flavors(client, template, project)
                _err(f"  {what}: {', '.join(names) or '(none)'}")
            raise typer.Exit(EXIT_REFUSED) from None
    req = response.data
    if quiet:
        typer.echo(req["id"])
    elif output == Output.table or wait:
        what = "already submitted (same Idempotency-Key)" if response.status == 200 else "submitted"
        _say(f"request {req['id']} ({req['project']}/{req['name']}) {what}; key {key}", output)
    if not wait:
        if output == Output.json and not quiet:
            _print_json(req)
        return
    with _errors():
        code = _follow(client, req, states, timeout=timeout, interval=interval, output=output, quiet=quiet)
    raise typer.Exit(code)


# ------------------------------------------------------------------------------------------------- wait, status
def _say(message: str, output: Output) -> None:
    """Progress: stdout for people, stderr when stdout carries JSON."""
    typer.echo(message, err=output == Output.json)


def _follow(client: Client, req: dict[str, Any], until: set[str], *, timeout: float, interval: float,
            output: Output, quiet: bool = False) -> int:
    """Poll the request (If-None-Match: an unchanged request costs a 304) until it reaches ``until``, ends,
    or ``timeout`` passes; print each change of state with the portal's "why is it pending?"."""
    url = f"/api/v1/requests/{req['id']}/"
    first = interval
    etag, last, deadline = "", ("", ""), time.monotonic() + timeout
    say: Callable[[str], None] = (lambda m: None) if quiet else (lambda m: _say(m, output))

    def done(code: int) -> int:
        if output == Output.json and not quiet:
            _print_json(req)
        return code

    while True:
        state, why = req["state"], req.get("pending_reason") or ""
        if (state, why) != last:
            last = (state, why)
            say(f"state: {state}" + (f" — {why}" if why else ""))
            interval = first  # something moves: look again soon
        if state in until or (state == "succeeded" and "running" in until):
            say(f"request {req['id']} {state}")
            return done(EXIT_OK)
        if state in FINAL:
            _err(f"request {req['id']} ended {state}" + (f": {req['state_reason']}" if req.get("state_reason") else ""))
            return done(EXIT_ENDED)
        left = deadline - time.monotonic()
        if left <= 0:
            _err(f"timed out waiting for {', '.join(sorted(until))}; request {req['id']} is {state}")
            return done(EXIT_TIMEOUT)
        time.sleep(min(interval, left))
        response = client.call("GET", url, headers={"If-None-Match": etag} if etag else None)
        etag = response.headers.get("etag", etag)
        if response.status == 304 or response.data is None:
            interval = min(interval * 1.5, MAX_INTERVAL, first * 6)  # nothing changed: no polling storm
            continue
        req = response.data


@app.command("wait")
def wait_(
    request_id: RequestId,
    until: Annotated[str, typer.Option(help="The state(s) that count as done, comma-separated (running: "
                                            "also succeeded).")] = "succeeded",
    timeout: Annotated[float, typer.Option(help="Seconds to wait in all.")] = 6 * 3600,
    interval: Annotated[float, typer.Option(envvar="GPUPORTAL_POLL_INTERVAL",
                                            help="First polling interval (seconds); grows while nothing changes, up to "
                                                 "6 times (at most a minute).")] = 10,
    output: OutputOpt = Output.table,
) -> None:
    """Wait for a request: exit 0 when it reaches --until, 1 when it ends otherwise, 3 on timeout."""
    states = _until(until)
    with _errors():
        client = _client()
        req = client.get(f"/api/v1/requests/{request_id}/")
        code = _follow(client, req, states, timeout=timeout, interval=interval, output=output)
    raise typer.Exit(code)


@app.command()
def status(request_id: RequestId, output: OutputOpt = Output.table) -> None:
    """A request's state, why it is pending, and its timeline."""
    with _errors():
        req = _client().get(f"/api/v1/requests/{request_id}/")
    if output == Output.json:
        _print_json(req)
        return
    template = req.get("template") or {}
    rows = [
        ("request", f"{req['id']}  {req['project']}/{req['name']}"),
        ("state", req["state"] + (f": {req['state_reason']}" if req.get("state_reason") else "")),
        ("pending", req.get("pending_reason") or ""),
        ("template", f"{template.get('slug')} v{template.get('version')}"),
        ("flavor", f"{req.get('flavor')} x {req.get('gpus')} GPU" + (f", {req['replicas']} replicas" if (req.get("replicas") or 1) > 1 else "")),
        ("image", req.get("image") or ""),
        ("requested", f"by {req.get('requested_by')} at {_when(req.get('created_at'))}"),
        ("expires", _when(req.get("expires_at"))),
    ]
    for label, value in rows:
        if value:
            typer.echo(f"{label:<10} {value}")
    timeline = req.get("timeline") or []
    if timeline:
        typer.echo("timeline:")
        for event in timeline:
            move = f"{event.get('from_state') or '–'} → {event['to_state']}" if event.get("to_state") else ""
            typer.echo(f"  {_when(event.get('at'))}  {move:<28} {event.get('actor_label') or ''}: {event.get('message') or ''}".rstrip(": "))


def _end(client: Client, request_id: int, action: str, reason: str, output: Output) -> None:
    req = client.call("POST", f"/api/v1/requests/{request_id}/{action}/", body={"reason": reason}).data
    if output == Output.json:
        _print_json(req)
    else:
        typer.echo(f"request {req['id']} ({req['project']}/{req['name']}) {req['state']}")


@app.command()
def cancel(
    request_id: RequestId,
    reason: Annotated[str, typer.Option(help="Why (shown in the timeline).")] = "",
    force: Annotated[bool, typer.Option("--force", "-f",
                                        help="End it whatever its state: a running request is stopped.")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Withdraw a request that is not running yet (waiting for approval, approved, queued). A running one is
    stopped instead: `gpuportal stop ID`, or `cancel --force`."""
    with _errors():
        client = _client()
        if force and client.get(f"/api/v1/requests/{request_id}/").get("state") in ("running", "preempted"):
            _end(client, request_id, "stop", reason, output)
            return
        try:
            _end(client, request_id, "cancel", reason, output)
        except Refused as exc:
            if exc.status == 409 and not force:
                _err(f"The portal refused: {exc}\nA running request is stopped instead: gpuportal stop {request_id} "
                     "(or gpuportal cancel --force).")
                raise typer.Exit(EXIT_REFUSED) from None
            raise


@app.command()
def stop(
    request_id: RequestId,
    reason: Annotated[str, typer.Option(help="Why (shown in the timeline).")] = "",
    output: OutputOpt = Output.table,
) -> None:
    """Stop a request that has started (queued or running): its pods end and its cluster objects are removed
    (a notebook keeps its home volume). It can be restarted from the portal."""
    with _errors():
        _end(_client(), request_id, "stop", reason, output)


@app.command("list")
def list_(
    state: Annotated[list[str] | None, typer.Option(help="Only these states (repeat).")] = None,
    project: Annotated[str | None, typer.Option(help="Only this project (slug).")] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only my requests.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 50,
    output: OutputOpt = Output.table,
) -> None:
    """Requests you can see, newest first."""
    params: list[tuple[str, Any]] = [("state", s) for s in state or []]
    params += [("project", project), ("mine", "true" if mine else None), ("ordering", "-created_at")]
    with _errors():
        items = _client().list("/api/v1/requests/", params, limit=limit)
    if output == Output.json:
        _print_json(items)
        return
    _table(["ID", "PROJECT", "NAME", "TEMPLATE", "FLAVOR", "GPUS", "STATE", "CREATED"],
           [[r["id"], r["project"], r["name"], (r.get("template") or {}).get("slug"), r.get("flavor"), r.get("gpus"),
             r["state"], _when(r.get("created_at"))] for r in items])


@app.command()
def templates(output: OutputOpt = Output.table) -> None:
    """The templates on offer and the flavors each allows."""
    with _errors():
        items = _client().list("/api/v1/templates/", {"active": "true"})
    if output == Output.json:
        _print_json(items)
        return
    _table(["SLUG", "VERSION", "KIND", "NAME", "GPUS", "FLAVORS"],
           [[t["slug"], t["version"], t["kind"], t["name"], f"{t.get('default_gpus')} (max {t.get('max_gpus')})",
             ", ".join(f["name"] for f in t.get("allowed_flavors") or [])] for t in items])


@app.command()
def flavors(output: OutputOpt = Output.table) -> None:
    """The flavors (kinds of GPU) on offer."""
    with _errors():
        items = _client().list("/api/v1/flavors/", {"active": "true"})
    if output == Output.json:
        _print_json(items)
        return
    _table(["NAME", "KIND", "GPU", "CLUSTER", "DESCRIPTION"],
           [[f["name"], f["kind"], f.get("gpu_model") or "", f.get("cluster"), f.get("display_name") or ""] for f in items])


# -------------------------------------------------------------------------------------------------------- logs
def _new_lines(before: list[str], now: list[str]) -> list[str]:
    """The lines of ``now`` not seen yet: after the longest end of ``before`` that ``now`` starts with."""
    for overlap in range(min(len(before), len(now)), 0, -1):
        if before[-overlap:] == now[:overlap]:
            return now[overlap:]
    return now


@app.command()
def logs(
    request_id: RequestId,
    tail: Annotated[int, typer.Option(min=1, max=5000, help="Lines per pod.")] = 200,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the request ends.")] = False,
    interval: Annotated[float, typer.Option(help="With --follow: seconds between looks.")] = 2,
    output: OutputOpt = Output.table,
) -> None:
    """The request's pods' logs (GET /api/v1/requests/ID/logs/); --follow until the request ends."""
    seen: dict[str, list[str]] = {}

    def show(data: dict[str, Any]) -> None:
        pods = data.get("pods") or []
        for pod in pods:
            lines = (pod.get("log") or "").splitlines()
            fresh = _new_lines(seen.get(pod["name"], []), lines)
            seen[pod["name"]] = lines
            prefix = f"{pod['name']} | " if len(pods) > 1 else ""
            for line in fresh:
                if output == Output.json:
                    typer.echo(json.dumps({"pod": pod["name"], "line": line}))
                else:
                    typer.echo(prefix + line)

    with _errors():
        client = _client()
        path = f"/api/v1/requests/{request_id}/logs/"
        data = client.get(path, params={"tail": tail})
        if not follow:
            if output == Output.json:
                _print_json(data)
            elif not data.get("pods"):
                _err(f"request {request_id} has no pods (yet)")
            else:
                show(data)
            return
        show(data)
        etag, ended = "", False
        try:
            while not ended:
                time.sleep(interval)
                response = client.call("GET", f"/api/v1/requests/{request_id}/",
                                       headers={"If-None-Match": etag} if etag else None)
                etag = response.headers.get("etag", etag)
                ended = response.status != 304 and response.data is not None and response.data["state"] in FINAL
                show(client.get(path, params={"tail": tail}))  # after an end: its last lines
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


__all__ = ["EXIT_ENDED", "EXIT_OK", "EXIT_REFUSED", "EXIT_TIMEOUT", "EXIT_UNREACHABLE", "Unreachable", "app", "main"]
