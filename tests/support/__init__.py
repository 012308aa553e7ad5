"""What the tests share: fakes and stand-ins, fresh processes and kernels, browsers, a Prometheus stack.

Test modules import from here, never from one another or from ``conftest`` (which holds only
pytest's hooks and fixtures): each test module stands on its own.
"""
