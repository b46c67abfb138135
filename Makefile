# The two commands: `make run` (portal + demo on http://127.0.0.1:8000/) and `make test`.
# Works with only Python >= 3.12 installed: no DATABASE_URL/REDIS_URL means SQLite and an
# SQLite broker under var/; set them for PostgreSQL and Redis.

VENV    ?= .venv
VPY     := $(VENV)/bin/python
# The first Python >= 3.12 found: python3.13, python3.12, python3, then pyenv's installed versions.
PYTHON  ?= $(shell for c in python3.14 python3.13 python3.12 python3 $$(ls -d $$(pyenv root 2>/dev/null)/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -r); do \
             $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo $$c; break; }; done)
STAMP   := $(VENV)/.installed

.PHONY: run run-sso test lint venv bench browser-deps services cluster cluster-build clean

# CLUSTER=real runs the portal on the real control plane (make cluster) instead of the sandbox.
run: venv
	PORTAL_CLUSTER=$(CLUSTER) $(VPY) deploy/devstack.py

# The same, with single sign-on against the test OpenID provider (tests/oidc; needs node and npm).
run-sso: venv
	PORTAL_DEV_SSO=1 $(VPY) deploy/devstack.py

test: venv
	$(VPY) deploy/run_tests.py $(ARGS)

# Ruff with the rule set in pyproject.toml, then mypy over every app's services and selectors (CI runs both
# before the tests).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: venv
	$(VPY) tests/bench/sandbox_bench.py

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python >= 3.12 is needed (set PYTHON=/path/to/python3.12)"; exit 1; }
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -r requirements.txt
	$(VPY) -m pip install --quiet --no-deps -e .  # the `gpuportal` client (pyproject.toml)
	@touch $(STAMP)

# PostgreSQL and Redis from Debian's packages, installed where missing and started on 127.0.0.1 where
# down (needs root or password-less sudo for that); `make test` then uses them.
services:
	deploy/services.sh

# The real control plane on loopback (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, Kueue, kwok
# nodes), built from released Go modules (realcluster/go.mod; needs Go); Ctrl-C stops it.
cluster: venv
	$(VPY) -m realcluster

cluster-build: venv
	$(VPY) -m realcluster --build-only

# The image without a registry: a Debian base made with mmdebstrap from apt's mirror (cached under var/image/),
# then buildah (chroot isolation); installs buildah and mmdebstrap where missing (deploy/build_image.py).
image:
	$(or $(wildcard $(VPY)),python3) deploy/build_image.py $(if $(TAG),--tag $(TAG))

# Browser tests drive Debian's Chromium (no browser download).
browser-deps:
	@command -v chromium >/dev/null || { sudo -n true 2>/dev/null && SUDO=sudo; $${SUDO:-} apt-get install -y chromium; }

clean:
	rm -rf var/
