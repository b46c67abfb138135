"""The installed ``gpuportal`` console script, run as a separate process against the live server.

``gp(*args)`` runs it with a fresh read+submit token of carol's in acme-vision (``$PORTAL_TOKEN``), the live
server's URL (``$PORTAL_URL``) and a config folder of the test's own. ``PYTHONPATH`` puts this checkout first,
so the script runs this checkout's client even when the venv's editable install points at another one.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tenants.models import ApiToken
from tenants.services import token_create

from ..workloads.factories import Catalogue, make_catalogue

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent / "gpuportal"


@pytest.fixture
def cat(cast) -> Catalogue:
    return make_catalogue(cast)


@pytest.fixture
def token(cast) -> str:
    _, raw = token_create(actor=cast.actor("carol"), project=cast.vision, name="pipeline", scope=ApiToken.Scope.SUBMIT)
    return raw


@pytest.fixture
def cli_env(live_server, token, tmp_path) -> dict[str, str]:
    assert BIN.exists(), f"{BIN} is missing: `make venv` installs the client (pip install -e .)"
    return {
        "PATH": f"{BIN.parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"), "PORTAL_URL": live_server.url, "PORTAL_TOKEN": token,
        "GPUPORTAL_POLL_INTERVAL": "0.2", "LANG": "C.UTF-8",
    }


@pytest.fixture
def gp(cli_env) -> Callable[..., Any]:
    """``gp(*args, env=..., background=False, input=None)``: run ``gpuportal``; ``env`` entries set to None are unset."""

    def run(*args: str, env: dict[str, str | None] | None = None, background: bool = False,
            input: str | None = None, timeout: float = 60) -> Any:
        full = {**cli_env, **(env or {})}
        full = {k: v for k, v in full.items() if v is not None}
        command = [str(BIN), *args]
        if background:
            return subprocess.Popen(command, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        return subprocess.run(command, env=full, capture_output=True, text=True, timeout=timeout, input=input, cwd="/", check=False)

    return run


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
