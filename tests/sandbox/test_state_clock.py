"""The state file keeps the simulated clock: after a restart, timestamps are never in the future and AGE is valid."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from sandbox.app import Sandbox
from sandbox.clock import parse_time
from sandbox.testing import control, kubectl

# A laptop without kubectl skips these; CI (PORTAL_REQUIRE_SERVICES=1) has it and never skips them.
pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None and os.environ.get("PORTAL_REQUIRE_SERVICES") != "1",
    reason="kubectl is not installed",
)


def _start(tmp_path, state, **kw) -> Sandbox:
    sb = Sandbox(kubeconfig=tmp_path / "kubeconfig", state_file=state, tick_interval=0, **kw)
    sb.kubecache = str(tmp_path / "kubecache")  # type: ignore[attr-defined]
    return sb.start()


def _cm(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
                       "data": {"k": "v"}})


def test_restart_from_state_file_resumes_the_simulated_clock(tmp_path):
    state = tmp_path / "state.json"
    sb = _start(tmp_path, state, speed=60)
    try:
        sb.advance(6 * 3600)  # six simulated hours ahead of the wall clock
        kubectl(sb, "create", "-f", "-", input=_cm("before"))
        saved_now = sb.clock.now()
        status, _, live = control(sb, "GET", "/sandbox/state")
        assert status == 200 and parse_time(live["clock"]["now"]) >= saved_now
    finally:
        sb.stop()
    data = json.loads(state.read_text())
    assert parse_time(data["clock"]["now"]) >= parse_time(
        next(o for o in data["objects"] if o["metadata"]["name"] == "before")["metadata"]["creationTimestamp"])

    sb2 = _start(tmp_path, state, speed=60)
    try:
        now = sb2.clock.now()
        assert now >= saved_now  # monotonic across restarts
        for obj in sb2.store.list("v1", "ConfigMap", "default")["items"]:
            assert parse_time(obj["metadata"]["creationTimestamp"]) <= now
        for node in sb2.store.list("v1", "Node")["items"]:
            assert parse_time(node["metadata"]["creationTimestamp"]) <= now
        kubectl(sb2, "create", "-f", "-", input=_cm("after"))
        before = sb2.store.get("v1", "ConfigMap", "before", "default")
        after = sb2.store.get("v1", "ConfigMap", "after", "default")
        assert after["metadata"]["creationTimestamp"] >= before["metadata"]["creationTimestamp"]
        out = kubectl(sb2, "get", "configmap", "before", "after", "-n", "default").stdout
        assert "<invalid>" not in out, out
        out = kubectl(sb2, "get", "nodes").stdout
        assert "<invalid>" not in out, out
    finally:
        sb2.stop()


def test_state_file_without_a_clock_resumes_after_its_latest_timestamp(tmp_path):
    """An older state file (objects only) still never yields timestamps in the future."""
    state = tmp_path / "state.json"
    sb = _start(tmp_path, state, speed=0)
    try:
        sb.advance(24 * 3600)
        kubectl(sb, "create", "-f", "-", input=_cm("old"))
    finally:
        sb.stop()
    data = json.loads(state.read_text())
    data.pop("clock", None)
    state.write_text(json.dumps(data))
    latest = parse_time(next(o for o in data["objects"] if o["metadata"]["name"] == "old")["metadata"]["creationTimestamp"])
    sb2 = _start(tmp_path, state, speed=0)
    try:
        assert sb2.clock.now() >= latest
        assert "<invalid>" not in kubectl(sb2, "get", "configmap", "old", "-n", "default").stdout
    finally:
        sb2.stop()
