# The agentsandbox Python driver: a persistent interpreter session inside a
# sandbox, driven by the library over the process's stdin and stdout. It is
# stdlib-only and runs on any python3 >= 3.8.
#
# Protocol: one JSON object per line both ways. Requests on stdin:
#   {"t": "run", "id": ID, "code": "..."}   run a cell
#   {"t": "interrupt", "id": ID}            raise KeyboardInterrupt in cell ID
# Messages on the original stdout (kept on a private descriptor; the user's
# descriptors 1 and 2 are pipes the driver reads, so whatever user code
# prints, even byte-for-byte copies of these messages, is data):
#   {"t": "ready", "python": "3.11.2"}
#   {"t": "out", "id": ID, "s": 1 or 2, "b": base64}   output of cell ID
#   {"t": "display", "id": ID, "data": {mime: str or base64 for images}}
#   {"t": "done", "id": ID, "error": null or {"name", "value", "traceback"}}
# ID is the host's random name for one run: it drops messages of any other
# run, so a message that comes late, or that code wrote to the driver's
# descriptor itself, is never taken for the result of the run after it.
import ast
import base64
import builtins
import importlib.abc
import importlib.util
import io
import json
import linecache
import os
import signal
import sys
import threading
import traceback
import types

_proto_fd = os.dup(1)
_req_fd = os.dup(0)
_lock = threading.Lock()
_rid = ""  # the run under way (or the last one)


def _send(msg):
    data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
    with _lock:
        view = memoryview(data)
        while view:
            n = os.write(_proto_fd, view)
            view = view[n:]


# User code reads EOF on stdin and writes into pipes the driver forwards.
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(os.devnull)
_pipes = {}
for _fd in (1, 2):
    _r, _w = os.pipe()
    os.dup2(_w, _fd)
    os.close(_w)
    _pipes[_fd] = _r
sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)
sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True)

# Each cell ends with a token written to both pipes; the forwarders report
# when they reach it, so every byte the cell wrote is sent before "done".
_token = os.urandom(16).hex().encode()
_seen = {1: threading.Event(), 2: threading.Event()}


def _forward(fd):
    r = _pipes[fd]
    held = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            return
        data = held + chunk
        while True:
            i = data.find(_token)
            if i < 0:
                break
            if i:
                _send({"t": "out", "id": _rid, "s": fd, "b": base64.b64encode(data[:i]).decode()})
            data = data[i + len(_token):]
            _seen[fd].set()
        keep = len(_token) - 1
        out, held = (data[:-keep], data[-keep:]) if len(data) > keep else (b"", data)
        if out:
            _send({"t": "out", "id": _rid, "s": fd, "b": base64.b64encode(out).decode()})


for _fd in (1, 2):
    threading.Thread(target=_forward, args=(_fd,), daemon=True).start()


def _flush_cell():
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            f.flush()
        except Exception:
            pass
    for fd in (1, 2):
        _seen[fd].clear()
        try:
            os.write(fd, _token)
        except OSError:
            continue
        _seen[fd].wait(2)


# Rich display, as Jupyter shows values.
_reprs = (
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)


def _bundle(obj):
    data = {}
    fig = sys.modules.get("matplotlib.figure")
    if fig is not None and isinstance(obj, fig.Figure):
        buf = io.BytesIO()
        obj.savefig(buf, format="png")
        data["image/png"] = base64.b64encode(buf.getvalue()).decode()
    elif not isinstance(obj, type):
        for mime, name in _reprs:
            meth = getattr(obj, name, None)
            if not callable(meth):
                continue
            try:
                v = meth()
            except Exception:
                continue
            if isinstance(v, tuple):  # (data, metadata)
                v = v[0]
            if v is None:
                continue
            if isinstance(v, (bytes, bytearray)):
                v = base64.b64encode(v).decode()
            elif mime == "application/json":
                v = json.dumps(v)
            elif not isinstance(v, str):
                continue
            data[mime] = v
    data["text/plain"] = repr(obj)
    return data


def display(*objs):
    """Show each object as a rich output of the running cell."""
    for obj in objs:
        _flush_cell_output()
        _send({"t": "display", "id": _rid, "data": _bundle(obj)})


def _flush_cell_output():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass


builtins.display = display


# matplotlib: a headless backend whose show() displays every open figure.
def _show_figures(*args, **kwargs):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        display(plt.figure(num))
    plt.close("all")


_hooks = types.ModuleType("agentsandbox_driver")
_hooks.show_figures = _show_figures
sys.modules["agentsandbox_driver"] = _hooks
_BACKEND = """
from matplotlib.backends.backend_agg import *  # noqa
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas
from matplotlib.backend_bases import FigureManagerBase as FigureManager
import agentsandbox_driver as _driver


def show(*args, **kwargs):
    _driver.show_figures()
"""


class _BackendLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(compile(_BACKEND, "<agentsandbox backend>", "exec"), module.__dict__)


class _BackendFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "agentsandbox_backend":
            return importlib.util.spec_from_loader(name, _BackendLoader())
        return None


sys.meta_path.append(_BackendFinder())
os.environ["MPLBACKEND"] = "module://agentsandbox_backend"

# The user's __main__, apart from the driver's own globals.
_main = types.ModuleType("__main__")
_main.__dict__["__builtins__"] = builtins
sys.modules["__main__"] = _main
_ns = _main.__dict__

# SIGINT raises KeyboardInterrupt only while a cell runs.
_running = False


def _on_sigint(signum, frame):
    if _running:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)
_main_thread = threading.main_thread().ident

_requests = []
_cond = threading.Condition()


def _read_requests():
    f = os.fdopen(_req_fd, "rb")
    for line in f:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if req.get("t") == "interrupt":
            if _running and req.get("id") == _rid:
                signal.pthread_kill(_main_thread, signal.SIGINT)
            continue
        with _cond:
            _requests.append(req)
            _cond.notify()
    with _cond:
        _requests.append(None)
        _cond.notify()


def _user_frames(tb_exc):
    """Drop the driver's frames, keep the cell's (and modules' below)."""
    stack = tb_exc.stack
    i = 0
    while i < len(stack) and stack[i].filename == "<string>":
        i += 1
    tb_exc.stack = traceback.StackSummary.from_list(list(stack)[i:])
    for sub in (tb_exc.__cause__, tb_exc.__context__):
        if sub is not None:
            _user_frames(sub)


def _error(e):
    te = traceback.TracebackException(type(e), e, e.__traceback__)
    _user_frames(te)
    value = str(e)
    if isinstance(e, SyntaxError):
        value = e.msg or value
    return {"name": type(e).__name__, "value": value, "traceback": "".join(te.format())}


_cells = 0


def _run(code, rid):
    global _running, _cells, _rid
    _rid = rid
    _cells += 1
    name = "<cell %d>" % _cells
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    err = None
    _running = True
    try:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), _ns)
        if last is not None:
            value = eval(compile(last, name, "eval"), _ns)
            if value is not None:
                _ns["_"] = value
                display(value)
        _show_figures()
    except BaseException as e:  # SystemExit and KeyboardInterrupt too
        _running = False
        err = _error(e)
        try:
            _show_figures()
        except Exception:
            pass
    finally:
        _running = False
    _flush_cell()
    _send({"t": "done", "id": rid, "error": err})


def _main_loop():
    threading.Thread(target=_read_requests, daemon=True).start()
    _send({"t": "ready", "python": "%d.%d.%d" % sys.version_info[:3]})
    while True:
        try:
            with _cond:
                while not _requests:
                    _cond.wait()
                req = _requests.pop(0)
            if req is None:
                return
            if req.get("t") == "run":
                _run(str(req.get("code", "")), str(req.get("id", "")))
        except KeyboardInterrupt:  # an interrupt that came late
            continue


_main_loop()
