"""e2b-code-interpreter (unchanged) running code through brig's interpreter on the
sandbox's port 49999."""

import base64

import pytest
from e2b import NotFoundException
from e2b_code_interpreter import Sandbox as CodeSandbox

# Generous: CI is a loaded 2-core VM.
TIMEOUT = 300


@pytest.fixture
def ci(label):
    sandbox = CodeSandbox.create(timeout=TIMEOUT, metadata={"suite": label})
    yield sandbox
    sandbox.kill()


def test_run_code_keeps_state_and_streams_output(ci):
    out = []
    first = ci.run_code("x = 41\nprint('hello')", on_stdout=out.append)
    assert first.error is None
    assert first.logs.stdout == ["hello\n"]
    assert [m.line for m in out] == ["hello\n"]
    second = ci.run_code("x + 1")
    assert second.text == "42"
    assert second.results[0].is_main_result
    assert second.execution_count == 2


def test_an_error_comes_with_its_name_value_and_traceback(ci):
    errors = []
    execution = ci.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "ZeroDivisionError" in execution.error.traceback
    assert errors and errors[0].name == "ZeroDivisionError"
    # The context lives on.
    assert ci.run_code("'still here'").text == "still here"


def test_a_matplotlib_chart_comes_back_as_png(ci):
    execution = ci.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.title('squares')\n"
        "plt.show()"
    )
    assert execution.error is None, execution.error
    pngs = [r.png for r in execution.results if r.png]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")


def test_contexts_are_separate_and_can_be_restarted_and_removed(ci):
    ctx = ci.create_code_context(cwd="/tmp")
    assert ctx.language == "python" and ctx.cwd == "/tmp"
    assert ci.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
    ci.run_code("y = 1", context=ctx)
    # The default context does not see it.
    assert ci.run_code("y").error.name == "NameError"
    listed = {c.id for c in ci.list_code_contexts()}
    assert ctx.id in listed
    ci.restart_code_context(ctx)
    assert ci.run_code("y", context=ctx).error.name == "NameError"
    ci.remove_code_context(ctx.id)
    assert ctx.id not in {c.id for c in ci.list_code_contexts()}
    with pytest.raises(NotFoundException):
        ci.remove_code_context(ctx.id)


def test_env_vars_are_set_for_one_run_only(ci):
    assert ci.run_code("import os; os.environ['ONE']", envs={"ONE": "1"}).text == "1"
    assert ci.run_code("import os; os.environ.get('ONE')").text is None


def test_code_and_commands_share_the_sandbox(ci):
    ci.files.write("data.txt", "3 4 5")
    assert ci.run_code("sum(int(n) for n in open('data.txt').read().split())").text == "12"
    ci.run_code("open('out.txt', 'w').write('from python')")
    assert ci.commands.run("cat out.txt").stdout == "from python"
