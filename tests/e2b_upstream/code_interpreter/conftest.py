# The fixtures of e2b-code-interpreter's tests (python/tests/conftest.py of
# e2b-dev/code-interpreter, Apache-2.0, see ../LICENSE), synchronous ones only: the
# sandbox comes from brig (E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY set by
# tests/e2b_upstream.rs).
import os
import uuid

import pytest

from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="session")
def sandbox_test_id():
    return f"test_{uuid.uuid4()}"


@pytest.fixture()
def template():
    return os.getenv("E2B_TESTS_TEMPLATE") or "code-interpreter-v1"


@pytest.fixture()
def sandbox_factory(request, template, sandbox_test_id):
    def factory(*, template_name: str = template, **kwargs):
        kwargs.setdefault("secure", False)
        kwargs.setdefault("timeout", 60)
        metadata = kwargs.setdefault("metadata", dict())
        metadata.setdefault("sandbox_test_id", sandbox_test_id)
        sandbox = Sandbox.create(template_name, **kwargs)
        request.addfinalizer(lambda: sandbox.kill())
        return sandbox

    return factory


@pytest.fixture()
def sandbox(sandbox_factory):
    return sandbox_factory()


@pytest.fixture
def debug():
    return os.getenv("E2B_DEBUG") is not None


@pytest.fixture(autouse=True)
def skip_by_debug(request, debug):
    if request.node.get_closest_marker("skip_debug"):
        if debug:
            pytest.skip("skipped because E2B_DEBUG is set")


@pytest.fixture
async def async_sandbox(template, sandbox_test_id):
    from e2b_code_interpreter import AsyncSandbox

    sandbox = await AsyncSandbox.create(
        template, timeout=60, metadata={"sandbox_test_id": sandbox_test_id}
    )
    yield sandbox
    await sandbox.kill()
