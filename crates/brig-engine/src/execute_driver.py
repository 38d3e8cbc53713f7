"""Runs the code of one `/v1/execute` request inside the sandbox.

Invocation (by the daemon, inside the sandbox, cwd = the working directory,
normally /workspace):

    python3 -u /path/to/execute_driver.py CODE_FILE LAST_LINE_INTERACTIVE

  CODE_FILE              the user's code, UTF-8. Put it outside the working
                         directory so it is not reported as an output file; the
                         driver only reads it.
  LAST_LINE_INTERACTIVE  "1": if the last statement is an expression, its value
                         is shown as the Python REPL shows it (sys.displayhook:
                         repr, nothing for None); "0": the code just runs.

  -u (unbuffered): output reaches the daemon as it is written, not when a
  buffer fills or the code ends, which matters when the daemon streams it.
  stdout and stderr are two pipes, so each keeps its own order but not the order
  between them: a line printed to stdout before one printed to stderr may arrive
  after it (code that needs one order writes both to one stream). -I is
  deliberately not used: it would drop PYTHONPATH and user site-packages that an
  image may rely on.

stdin, stdout and stderr are the user code's own. The exit status is what
`python3 script.py` gives: 0, the `sys.exit()` code, 1 for an uncaught
exception or a syntax error (printed as Python prints them, in the user's
line numbers as file "<code>", without the driver's own frames), 130 for an
uncaught KeyboardInterrupt.

The code runs as `__main__` in a fresh module, as `python3 -c` would run it:
`__name__ == "__main__"`, functions and classes defined in it pickle by
reference to `__main__`, `sys.argv == ["<code>"]`, and the working directory
is first on sys.path (modules uploaded next to the code are importable).

Python 3.8 or newer (Debian bookworm has 3.11).
"""

import __future__
import ast
import builtins
import linecache
import os
import sys
import traceback
import types

FILENAME = "<code>"
# The file name in the driver's own frames, which tracebacks leave out.
DRIVER_FILE = sys._getframe().f_code.co_filename


def main():
    code_file, interactive = sys.argv[1], sys.argv[2] == "1"
    with open(code_file, encoding="utf-8") as f:
        source = f.read()

    # Plots are written to files, never to a display the sandbox does not have.
    os.environ.setdefault("MPLBACKEND", "Agg")
    # Like `python3 -c`: the working directory, not the driver's, is importable.
    # Python put the driver's directory first unless told not to (-I, -P).
    if sys.flags.isolated or getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, "")
    else:
        sys.path[0] = ""
    sys.argv = [FILENAME]
    # Tracebacks, warnings and inspect.getsource() read "<code>" from linecache;
    # an mtime of None keeps linecache.checkcache() from dropping it.
    linecache.cache[FILENAME] = (
        len(source),
        None,
        source.splitlines(True),
        FILENAME,
    )

    try:
        body, last = compile_code(source, interactive)
    except (SyntaxError, ValueError) as e:
        # Errors found by the compiler (not the parser) carry no line text.
        if isinstance(e, SyntaxError) and e.text is None and e.lineno:
            e.text = linecache.getline(FILENAME, e.lineno)
        # As Python prints a syntax error in a script: no "Traceback" header.
        show(e, None)
        return 1

    # A module of its own registered as __main__: pickle, multiprocessing and
    # `import __main__` find the user's names there, not the driver's.
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    try:
        exec(body, module.__dict__)
        if last is not None:
            exec(last, module.__dict__)
    except SystemExit:
        raise  # handled by the interpreter exactly as for a script
    except BaseException as e:
        tb = e.__traceback__
        # Trim the driver's frames: the traceback starts at the user's code.
        while tb is not None and tb.tb_frame.f_code.co_filename == DRIVER_FILE:
            tb = tb.tb_next
        show(e, tb)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    return 0


def show(e, tb):
    """Prints an uncaught exception as Python would, with traceback `tb`."""
    # The traceback printed is the exception's own, so it must be replaced.
    e = e.with_traceback(tb)
    if sys.excepthook is sys.__excepthook__:
        # The default hook of Python < 3.13 reads source lines from files only;
        # the traceback module also finds "<code>" in linecache.
        traceback.print_exception(type(e), e, tb)
    else:
        sys.excepthook(type(e), e, tb)  # one the user's code installed


def compile_code(source, interactive):
    """Compiles the code; with `interactive`, a final expression statement is
    compiled apart in "single" mode, so running it calls sys.displayhook as the
    REPL does."""
    tree = ast.parse(source, FILENAME)
    # `from __future__` imports must also apply to the split-off last statement.
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                feature = getattr(__future__, alias.name, None)
                flags |= getattr(feature, "compiler_flag", 0)
    last = None
    if interactive and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Interactive(body=[tree.body.pop()])
        last = compile(last, FILENAME, "single", flags=flags, dont_inherit=True)
    body = compile(tree, FILENAME, "exec", flags=flags, dont_inherit=True)
    return body, last


if __name__ == "__main__":
    # Not sys.exit: the user's code may have replaced it.
    raise SystemExit(main())
