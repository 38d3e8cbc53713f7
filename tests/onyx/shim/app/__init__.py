"""Stands in for onyx's server package (`app`) in its vendored tests: see
tests/onyx/conftest.py."""
