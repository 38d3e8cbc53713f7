"""Only `fastapi.testclient` of FastAPI, for onyx's vendored tests: see
tests/onyx/conftest.py."""
