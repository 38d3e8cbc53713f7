# brig's interpreter kernel: one per context, inside the session's sandbox.
#
# Requests come one JSON object a line on stdin ({"code", "n", "env"}); events go one JSON
# object a line on the stdout brig gave it. Before any user code runs, both are
# moved to private descriptors and fds 0, 1 and 2 are replaced (0 by /dev/null, 1
# and 2 by pipes this kernel reads), so nothing user code or its subprocesses print
# can pass for an event: their output arrives as stream events, written by us.
# Plain python3 only (no IPython): sessions on host dirs have Debian's.
import ast
import base64
import builtins
import codecs
import io
import json
import linecache
import os
import select
import signal
import sys
import threading
import traceback
import types
import warnings


def main():
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    events = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    lock = threading.Lock()

    def emit(event):
        data = (json.dumps(event) + "\n").encode()
        # An interrupt must not cut a line: it waits until the line is out.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            while data:
                data = data[os.write(events, data):]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    streams = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        os.set_blocking(r, False)
        streams[r] = (name, codecs.getincrementaldecoder("utf-8")("replace"))
    # A line at a time, as a notebook shows it: print()'s text and its newline go
    # out together. What a line leaves unfinished goes out before the next event.
    sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), "utf-8",
                                  "backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", 0, closefd=False), "utf-8",
                                  "backslashreplace", line_buffering=True)

    def drain():
        # Under `lock`: what the pipes hold now, as events.
        for fd, (name, decoder) in streams.items():
            while True:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                text = decoder.decode(data)
                if text:
                    emit({"type": name, "text": text})

    def pump():
        while True:
            select.select(list(streams), [], [])
            with lock:
                drain()

    threading.Thread(target=pump, daemon=True).start()

    def emit_in_order(event):
        # After everything printed before it.
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        with lock:
            drain()
            if event is not None:
                emit(event)

    running = [False]

    def on_sigint(signum, frame):
        # brig interrupts running code only, once: between runs the kernel's own
        # code must not be broken off.
        if running[0]:
            running[0] = False
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    warnings.filterwarnings("ignore", message=".*non-interactive.*")

    def capture_figures():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        if getattr(plt.show, "__module__", None) != __name__:
            plt.show = lambda *a, **k: capture_figures()
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            data = {"text/plain": safe(repr, fig),
                    "image/png": base64.b64encode(buf.getvalue()).decode()}
            try:
                data[CHART] = describe(fig)
            except Exception:
                pass
            try:
                # E2B's chart data, where the image has its extractor (e2b-charts).
                from e2b_charts import chart_figure_to_dict

                data["e2b/chart"] = chart_figure_to_dict(fig)
            except Exception:
                pass
            emit_in_order({"type": "result", "data": data, "main": False})
        plt.close("all")

    def display(*objs):
        """Shows each object as a rich result (a MIME bundle)."""
        for obj in objs:
            emit_in_order({"type": "result", "data": bundle(obj), "main": False})

    builtins.display = display
    main_module = types.ModuleType("__main__")
    main_module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main_module
    ns = main_module.__dict__

    def run(code, n, env):
        filename = "<cell-%d>" % n
        code = leading_indent(code)
        try:
            tree = ast.parse(code, filename, "exec")
        except SyntaxError as original:
            # Not Python: perhaps IPython's shell escapes (`!ls`, `%pip install`).
            shelled = shell_escapes(code)
            if shelled == code:
                raise
            try:
                tree = ast.parse(shelled, filename, "exec")
            except SyntaxError:
                raise original from None
            code = shelled
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            running[0] = True
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), ns)
            if last is not None:
                value = eval(compile(last, filename, "eval"), ns)
                if value is not None:
                    ns["_"] = value
                    emit_in_order({"type": "result", "data": bundle(value), "main": True})
            capture_figures()
        except BaseException as e:  # the user's SystemExit and Ctrl-C included
            try:
                capture_figures()
            except BaseException:
                pass
            emit_in_order(error_event(e))
        finally:
            running[0] = False
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    ns["__brig_shell__"] = shell
    emit({"type": "ready", "python": sys.version.split()[0]})
    while True:
        line = requests.readline()
        if not line:
            return
        try:
            request = json.loads(line)
            run(request["code"], int(request.get("n", 0)), dict(request.get("env") or {}))
        except KeyboardInterrupt:
            pass
        except Exception as e:
            emit_in_order(error_event(e))
        running[0] = False
        emit_in_order({"type": "end"})


def leading_indent(code):
    """`code` without the indentation of its first line, taken off every line that
    has it, as IPython does: a cell pasted from an indented block (or written in an
    indented string) runs. Python never starts indented, so nothing valid changes."""
    lines = code.splitlines(True)
    first = next((l for l in lines if l.strip()), "")
    indent = first[: len(first) - len(first.lstrip(" \t"))]
    if not indent:
        return code
    return "".join(l[len(indent):] if l.startswith(indent) else l for l in lines)


def shell_escapes(code):
    """`code` with IPython's shell escapes as calls: a line `!cmd` runs `cmd` in a
    shell, `%pip ...` runs pip, as a notebook would. Only for code that is not
    Python as it is, so that no valid program changes meaning."""
    out = []
    for line in code.splitlines(True):
        body = line.lstrip()
        indent = line[: len(line) - len(body)]
        command = None
        if body.startswith("!"):
            command = body[1:]
        elif body.startswith("%pip ") or body.startswith("%pip\n"):
            command = "pip" + body[4:]
        if command is None:
            out.append(line)
        else:
            out.append("%s__brig_shell__(%r)\n" % (indent, command.rstrip("\n")))
    return "".join(out)


def shell(command):
    """Runs a shell escape; its output goes where the cell's does."""
    import subprocess

    sys.stdout.flush()
    sys.stderr.flush()
    subprocess.run(command, shell=True, stdin=subprocess.DEVNULL)


def safe(f, *args):
    try:
        return f(*args)
    except BaseException as e:
        return "<%s failed: %s>" % (getattr(f, "__name__", "repr"), type(e).__name__)


CHART = "application/vnd.brig.chart+json"
# Points or bars a chart description carries per element, at most.
CHART_POINTS = 1000


def describe(fig):
    """What a figure shows, for a model that cannot see the image: each axes'
    title and labels, and its lines, scatters and bars with their data."""

    def num(v):
        try:
            return float(v)
        except Exception:
            return str(v)

    def label(artist):
        text = artist.get_label()
        return None if not text or text.startswith("_") else str(text)

    axes = []
    for ax in fig.get_axes():
        elements = []
        for line in ax.get_lines():
            xs, ys = line.get_xdata(), line.get_ydata()
            points = [[num(x), num(y)] for x, y in zip(list(xs)[:CHART_POINTS], list(ys)[:CHART_POINTS])]
            elements.append({"type": "line", "label": label(line), "points": points})
        for coll in ax.collections:
            offsets = getattr(coll, "get_offsets", lambda: [])()
            if len(offsets):
                points = [[num(x), num(y)] for x, y in list(offsets)[:CHART_POINTS]]
                elements.append({"type": "scatter", "label": label(coll), "points": points})
        for container in getattr(ax, "containers", []):
            patches = list(getattr(container, "patches", []))[:CHART_POINTS]
            if patches:
                bars = [{"x": num(p.get_x() + p.get_width() / 2), "height": num(p.get_height())}
                        for p in patches]
                elements.append({"type": "bar", "label": label(container), "bars": bars})
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        axes.append({"title": ax.get_title(), "x_label": ax.get_xlabel(),
                     "y_label": ax.get_ylabel(), "x_tick_labels": ticks, "elements": elements})
    return {"axes": axes}


REPRS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_json_", "application/json"),
    ("_repr_latex_", "text/latex"),
    ("_repr_javascript_", "application/javascript"),
)


def bundle(obj):
    """The object's MIME bundle, as IPython's display system would build it."""
    data = {}
    if not isinstance(obj, type):
        method = safe(getattr, obj, "_repr_mimebundle_", None)
        if callable(method):
            try:
                got = method()
                if isinstance(got, tuple):
                    got = got[0]
                if isinstance(got, dict):
                    data.update(got)
            except Exception:
                pass
        for name, mime in REPRS:
            if mime in data:
                continue
            method = safe(getattr, obj, name, None)
            if not callable(method):
                continue
            try:
                value = method()
            except Exception:
                continue
            if isinstance(value, tuple):
                value = value[0]
            if value is not None:
                data[mime] = value
    data.setdefault("text/plain", safe(repr, obj))
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(obj, pandas.DataFrame):
        # The table's columns as lists (E2B's `e2b/data`).
        try:
            columns = obj.to_dict("list")
        except Exception:
            columns = {}
        data["e2b/data"] = {str(k): [v.isoformat() if isinstance(v, pandas.Timestamp) else v
                                     for v in col] for k, col in columns.items()}
    elif isinstance(obj, (list, dict)) and "application/json" not in data:
        data["application/json"] = obj
    out = {}
    for mime, value in data.items():
        if isinstance(value, (bytes, bytearray)):
            value = base64.b64encode(value).decode()
        try:
            json.dumps(value)
        except Exception:
            continue
        out[str(mime)] = value
    return out


def error_event(e):
    tb = e.__traceback__
    # Only the user's frames: the kernel's own are noise to them.
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
        tb = tb.tb_next
    lines = traceback.format_exception(type(e), e, tb)
    return {"type": "error", "name": type(e).__name__, "value": safe(str, e),
            "traceback": "".join(lines)}


main()
