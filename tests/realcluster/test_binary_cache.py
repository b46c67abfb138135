"""The real control plane's binary cache (``realcluster.controlplane.go_build``): a build is kept under a key of what
it is made from, a second checkout copies it instead of linking again, and a change to an input builds anew."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from realcluster import controlplane


@pytest.fixture
def module(tmp_path: Path, monkeypatch) -> Path:
    if shutil.which("go") is None:  # CI puts Go on PATH (.ci/run); its usual place otherwise
        monkeypatch.setenv("PATH", f"{os.environ['PATH']}{os.pathsep}/usr/local/go/bin")
    monkeypatch.setenv("REALCLUSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GOFLAGS", "-mod=mod")
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "go.mod").write_text("module example.com/hello\n\ngo 1.22\n")
    (mod / "main.go").write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello") }\n')
    return mod


def test_a_second_checkout_copies_the_kept_binary_and_a_changed_input_builds_again(module: Path, tmp_path: Path) -> None:
    inputs = [module / "go.mod", module / "main.go"]
    first = tmp_path / "one" / "hello"
    first.parent.mkdir()
    controlplane.go_build(first, ".", "-s -w", cwd=module, inputs=inputs)
    kept = controlplane.cached_binary("hello", ".", "-s -w", cwd=module, inputs=inputs)
    assert kept.is_file() and kept.read_bytes() == first.read_bytes()
    assert kept.is_relative_to(tmp_path / "cache")

    # What the cache holds is what a second checkout gets (marked, to tell a copy from a build).
    kept.write_bytes(first.read_bytes() + b"kept")
    second = tmp_path / "two" / "hello"
    second.parent.mkdir()
    controlplane.go_build(second, ".", "-s -w", cwd=module, inputs=inputs)
    assert second.read_bytes().endswith(b"kept") and os.access(second, os.X_OK)

    # Another source, other link flags, or use_cache=False: built, not copied.
    (module / "main.go").write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("changed") }\n')
    third = tmp_path / "three" / "hello"
    third.parent.mkdir()
    controlplane.go_build(third, ".", "-s -w", cwd=module, inputs=inputs)
    assert not third.read_bytes().endswith(b"kept") and b"changed" in third.read_bytes()
    assert controlplane.cached_binary("hello", ".", "-s -w", cwd=module, inputs=inputs) != kept
    (module / "main.go").write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello") }\n')
    assert controlplane.cached_binary("hello", ".", "-s", cwd=module, inputs=inputs) != kept
    fourth = tmp_path / "four" / "hello"
    fourth.parent.mkdir()
    controlplane.go_build(fourth, ".", "-s -w", cwd=module, inputs=inputs, use_cache=False)
    assert not fourth.read_bytes().endswith(b"kept") and kept.read_bytes() == fourth.read_bytes()
