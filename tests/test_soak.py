"""The soak (tests/bench/soak.py) in the suite: the `make run` stack on the embedded defaults, leaned on for
SOAK_MINUTES minutes (default 5), must not crash, lose or duplicate a request, or answer 5xx.

It runs the stack as `make run` does (deploy/devstack.py, SQLite and the SQLite broker in a temporary
folder), whatever database the rest of the suite uses: the embedded defaults are what a laptop gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MINUTES = float(os.environ.get("SOAK_MINUTES", "5"))
SERVICES = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}


@pytest.mark.soak
@pytest.mark.timeout(int(MINUTES * 60) + 1200)
def test_soak_on_the_embedded_defaults(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in SERVICES}
    result = subprocess.run(
        [sys.executable, "tests/bench/soak.py", "--minutes", str(MINUTES), "--var-dir", str(tmp_path / "var")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=MINUTES * 60 + 1100, check=False,
    )
    figures = result.stdout[result.stdout.find("=== soak figures ==="):]
    print(result.stdout[-6000:])
    assert result.returncode == 0, f"{figures}\n{result.stderr[-3000:]}\nstack log: {tmp_path}"
    assert "soak: OK" in result.stdout
