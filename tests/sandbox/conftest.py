from sandbox.testing import fresh_sandbox, sandbox_cluster  # noqa: F401
