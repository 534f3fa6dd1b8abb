"""Tooling around the library (engine runner, random-weight models, demo, benchmarks).

The library never imports this package; only the ``kvmux`` command line does.
"""
