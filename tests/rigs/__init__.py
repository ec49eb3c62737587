"""The tests' rigs: what several test files share.

- ``real_sandboxes``: the real sandboxes (local, Docker, Podman, the Kubernetes double) with a
  way to run and spawn workload commands in them;
- one module per test file whose rule tests moved to tests/rules/ (``rigs.teardown_use_case``
  holds the helpers and fixtures first written in tests/test_teardown_use_case.py), imported by
  the family files and by the tests that stayed.
"""
