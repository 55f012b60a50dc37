"""The package's shape, as DESIGN.md states it, checked from the source text.

* Layers: a module imports only modules of its own layer or of layers above it
  in DESIGN.md's list (fir, model, vm, runtime, compare, sanitize, cost, gpu, debug,
  profile, then tui / dap / cli); nothing imports ``cli``. Imports inside
  functions count. Only firscope/gpu/device.py imports ``wgpu`` (the optional extra).
* No import cycle between modules (imports inside functions count too).
* Size: no module over 600 lines unless its docstring says why in a line
  beginning with ``size:``; no function over 80 lines or cyclomatic complexity
  over 25, except at most three whose docstring gives the reason as
  ``length: ...`` or ``complexity: ...``.
* Every package's ``__init__`` says what it exports (``__all__``).
* No module outside debug/session.py touches a private attribute of ``Session``.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from conftest import REPO

PKG = REPO / "firscope"
# Rank of each top-level part of the package: a module may import ranks <= its own.
LAYERS = {
    "errors": 0, "jitcache": 0, "samples": 0, "dump": 0, "text": 0, "defaults": 0,
    "engines": 0,
    "__init__": 0,
    "fir": 1, "model": 2, "vm": 3, "runtime": 4, "compare": 5, "sanitize": 6, "debug": 7,
    "profile": 8, "tui": 9, "dap": 9, "api": 9, "patching": 9, "cli": 10, "__main__": 11,
    # the speed-of-light analysis reads what runtime recorded (the rank of sanitize)
    "cost": 6,
    # the GPU engine: its diff uses compare/ and sanitize/ (a rank between sanitize and debug)
    "gpu": 6.5,
    # the quantization workbench: runs variants of a model (runtime/) over a corpus
    "quant": 6,
    # an edited kernel replayed: compare/'s lanes and metrics, sanitize/, cost/, quant's stats
    "edit": 6.8,
}
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_COMPLEXITY = 25
MAX_EXCUSED_FUNCTIONS = 3


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per test process: the checks only read trees, and
    each of them walks every module of the package."""
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def walked(path: Path) -> tuple[ast.AST, ...]:
    """``ast.walk`` of a file's tree, made once per test process (walking is most of what
    these checks cost)."""
    return tuple(ast.walk(parsed(path)))


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = modules()


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(module: str, path: Path) -> set[str]:
    """Every firscope module this one imports, anywhere in its text."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    found = set()
    for node in walked(path):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            subs = [f"{stem}.{a.name}" for a in node.names]
            # `from . import syntax` imports the submodule, not (only) the package
            names = subs if all(s in MODULES for s in subs) else [stem] + subs
        else:
            continue
        for name in names:
            if name.split(".")[0] != "firscope":
                continue
            # the longest prefix that is a module of ours
            parts = name.split(".")
            for k in range(len(parts), 0, -1):
                cand = ".".join(parts[:k])
                if cand in MODULES:
                    if cand != module:
                        found.add(cand)
                    break
    return found


GRAPH = {m: imports_of(m, p) for m, p in MODULES.items()}


def test_every_part_has_a_layer():
    unknown = sorted({part_of(m) for m in MODULES} - set(LAYERS))
    assert not unknown, f"add these to DESIGN.md's layer list and to LAYERS: {unknown}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layer_order(module):
    me = LAYERS.get(part_of(module))
    bad = []
    for dep in sorted(GRAPH[module]):
        if module == "firscope" and dep in LAZY_ENTRY_POINTS:
            continue  # imported inside __getattr__ on first use (PEP 562), see below
        dep_part = part_of(dep)
        if dep_part == "cli" and part_of(module) not in ("cli", "__main__"):
            bad.append(f"{dep} (nothing imports cli)")
        elif dep_part != "__init__" and LAYERS.get(dep_part, 99) > me:
            bad.append(f"{dep} (layer {dep_part} is below {part_of(module)})")
    assert not bad, f"{module} imports " + ", ".join(bad)


# What the package's __init__ may import inside its PEP 562 __getattr__, and nothing else:
# the library's entry points (firscope.open, firscope.Debugger, firscope.patching).
LAZY_ENTRY_POINTS = {"firscope.api", "firscope.api.model", "firscope.api.run",
                     "firscope.debug.debugger", "firscope.patching"}


def test_the_package_imports_its_entry_points_only_on_first_use():
    """``import firscope`` stays cheap: the entry points are imported inside ``__getattr__``
    (PEP 562), never at the top of ``firscope/__init__.py``."""
    tree = parsed(PKG / "__init__.py")
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {(n.module or "") for n in top if isinstance(n, ast.ImportFrom)}
    assert names <= {"__future__", "errors"}, names
    lazy = GRAPH["firscope"] - {"firscope.errors", "firscope.text"}
    assert lazy and lazy <= LAZY_ENTRY_POINTS, lazy
    code = ("import sys, firscope\n"
            "assert 'numpy' not in sys.modules and 'firscope.api' not in sys.modules\n"
            "assert callable(firscope.open) and 'firscope.api' in sys.modules\n"
            "import firscope.patching\n"
            "assert firscope.patching.sweep is firscope.api.patching.sweep\n")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_only_the_gpu_device_module_imports_wgpu():
    found = []
    for module, path in MODULES.items():
        for node in walked(path):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] == "wgpu" for n in names):
                found.append(module)
    assert sorted(set(found)) == ["firscope.gpu.device"], found


def outside_imports(path: Path) -> set[str]:
    """The top-level names of the modules outside firscope that ``path`` imports."""
    found = set()
    for node in walked(path):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"firscope"}


def test_only_the_command_line_imports_argparse():
    """``argparse.Namespace`` stops at cli.py: the commands below it take typed options."""
    found = sorted(m for m, p in MODULES.items() if "argparse" in outside_imports(p))
    assert found == ["firscope.cli"], f"argparse is imported by {found}"


def test_one_place_constructs_a_session():
    """Every front end (batch, UI, DAP) opens its Session through debug/opening.py."""
    calls = []
    for module, path in MODULES.items():
        for node in walked(path):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name == "Session":
                    calls.append(f"{module}:{node.lineno}")
    assert len(calls) == 1 and calls[0].startswith("firscope.debug.opening:"), (
        f"Session is constructed at {calls}; open it with debug.opening.open_session")


def test_no_import_cycles():
    index, low, stack, on, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w == "firscope":
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in GRAPH:
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


def _docstring(node) -> str:
    return ast.get_docstring(node) or ""


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module):
    path = MODULES[module]
    n = len(path.read_text(encoding="utf-8").splitlines())
    if n > MAX_MODULE_LINES:
        doc = _docstring(parsed(path))
        said = [ln for ln in doc.splitlines() if ln.lstrip().startswith("size:")]
        assert said, (f"{path.relative_to(REPO)} has {n} lines (> {MAX_MODULE_LINES}) and no "
                      "line of its docstring begins with 'size:' to say why")


def complexity(fn) -> int:
    """McCabe's number: 1 + decision points, not counting nested functions or classes."""
    n = 1
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While,
                             ast.ExceptHandler, ast.match_case)):
            n += 1
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            n += 1 + len(node.ifs)
        todo.extend(ast.iter_child_nodes(node))
    return n


def functions():
    for module, path in MODULES.items():
        for node in walked(path):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield module, node


def oversized() -> list[tuple[str, str, int, int, bool]]:
    out = []
    for module, fn in functions():
        length = fn.end_lineno - fn.lineno + 1
        cx = complexity(fn)
        if length > MAX_FUNCTION_LINES or cx > MAX_COMPLEXITY:
            doc = _docstring(fn)
            excused = (("length:" in doc or length <= MAX_FUNCTION_LINES)
                       and ("complexity:" in doc or cx <= MAX_COMPLEXITY))
            out.append((module, f"{fn.name} (line {fn.lineno})", length, cx, excused))
    return out


def test_function_size_and_complexity():
    big = oversized()
    unexcused = [f"{m}.{f}: {ln} lines, complexity {cx}" for m, f, ln, cx, ok in big if not ok]
    assert not unexcused, "over the limits (80 lines, complexity 25):\n" + "\n".join(unexcused)
    assert len(big) <= MAX_EXCUSED_FUNCTIONS, (
        f"more than {MAX_EXCUSED_FUNCTIONS} functions need an excuse: "
        + ", ".join(f"{m}.{f}" for m, f, *_ in big))


@pytest.mark.parametrize("package", sorted(m for m, p in MODULES.items()
                                           if p.name == "__init__.py"))
def test_packages_declare_exports(package):
    tree = parsed(MODULES[package])
    names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)}
    assert "__all__" in names, f"{package}/__init__.py has no __all__"


def test_complexity_counts_decisions():
    """The measure itself: a function with one if, a for with an if, and an `and`."""
    fn = ast.parse("def f(a, b):\n    if a and b:\n        return 1\n"
                   "    return [x for x in a if x]\n").body[0]
    assert complexity(fn) == 1 + 1 + 1 + 2


SCRIPTS = sorted((PKG.parent / "benchmarks").glob("*.py")) + sorted(
    (PKG.parent / "screenshots").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_scripts_outside_the_package_compile(script):
    """The benchmark and screenshot scripts are not imported by any test; a bad merge once
    left benchmarks/fuzz.py unparseable without a failing test."""
    compile(script.read_text(encoding="utf-8"), str(script), "exec")


# -- the session's insides stay in debug/session.py ---------------------------------------------
SESSION = PKG / "debug" / "session.py"
# How front ends and debug modules spell a session; `x._name` on one of these is reaching in.
SESSION_SPELLINGS = {"session", "sess", "self.session", "self.s", "ci.s", "self.ci.s"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def session_private_names() -> set[str]:
    """Session's private attributes: its ``_methods`` and every ``self._x`` in its class body
    (``__init__`` included), read from the source."""
    tree = parsed(SESSION)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
            names.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "self" and _private(node.attr)):
            names.add(node.attr)
    return names


def private_session_uses(path: Path, names: set[str]) -> list[str]:
    """Two ways of reaching into a Session, found by an AST walk: an attribute that is one
    of Session's private names on anything but ``self``/``cls`` (whatever the variable is
    called; getattr/setattr/hasattr with the name as a string too), and any ``_attribute``
    on an expression spelled like a session (SESSION_SPELLINGS: private names Session does
    not define yet, patched in from outside). A private attribute of another class that
    happens to share a name with one of Session's is flagged too: rename it."""
    found = []
    for node in walked(path):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = ast.unparse(node.value)
            if (node.attr in names and owner not in ("self", "cls")) \
                    or owner in SESSION_SPELLINGS:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in names):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_only_debug_session_touches_the_session_private_attributes():
    """Predicates, checkpoints and the reference dump go through Session's public methods
    and its SessionState (issue 22), so a change inside Session stays inside session.py."""
    names = session_private_names()
    assert {"_resume", "_rewind", "_hit"} <= names, "the scan no longer finds Session's privates"
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if path != SESSION:
            bad += [f"{path.relative_to(REPO)} {u}" for u in private_session_uses(path, names)]
    assert not bad, "private Session attributes used outside debug/session.py:\n" + \
        "\n".join(bad)


def test_the_private_session_scan_finds_reaching_in(tmp_path):
    """The scan itself, on a small text: both ways are caught, a class's own privates not."""
    path = tmp_path / "m.py"
    path.write_text("def f(session, obs, ci):\n"
                    "    obs.s._hit(1, 2)\n"          # a Session private, through another name
                    "    session._patched = 1\n"      # a private patched onto a session
                    "    getattr(ci, '_rewind')\n"
                    "    return ci.s.here()\n"
                    "class C:\n"
                    "    def g(self):\n"
                    "        return self._hit\n")     # C's own
    found = private_session_uses(path, {"_hit", "_rewind"})
    assert sorted(int(f.split(":")[0].split()[1]) for f in found) == [2, 3, 4], found

# -- `name@layer` is spelled by model/ref.py alone -------------------------------------------
# Text joined to '@' that is not a layer: the assembler's buffer operands (`@x`), the nesting
# label of a for/if block at a line (`for@62`), the attention row's argmax (`max 0.93@4`).
NOT_A_LAYER = {
    ("firscope/vm/operands.py", "self.operand"): "an operand as the assembler spells it: @x",
    ("firscope/vm/operands.py", "target"): "an operand as the assembler spells it: @x",
    ("firscope/vm/operands.py", "ref.target"): "an operand as the assembler spells it: @x",
    ("firscope/runtime/plan.py", "name"): "an operand as the assembler spells it: @x",
    ("firscope/runtime/plan.py", "a.operand"): "an operand as the assembler spells it: @x",
    ("firscope/debug/info.py", "f.kind"): "a block opened at a line: for@62",
    ("firscope/debug/info.py", "d.ops[f.pc].loc.line"): "a block opened at a line: for@62",
    ("firscope/dap/views.py", "opener"): "a block opened at a line: for@62",
    ("firscope/tui/attention_view.py", "rows[h].max():.2f"): "a row's maximum at its index",
    ("firscope/tui/attention_view.py", "int(np.argmax(rows[h]))"): "a row's maximum at its index",
}


def _joins_at(nodes):
    """(the expression joined to '@', line), among ``nodes`` (a tree's walk), for every
    f-string piece, ``+`` chain, ``%`` or
    ``.format`` template that puts something next to an '@': ``f"{name}@{layer}"``,
    ``name + "@" + str(layer)``, ``"%s@%d" % (name, layer)``."""
    def src(node):
        if isinstance(node, ast.FormattedValue):
            spec = "".join(v.value for v in node.format_spec.values
                           if isinstance(v, ast.Constant)) if node.format_spec else ""
            return ast.unparse(node.value) + (":" + spec if spec else "")
        return ast.unparse(node)

    def text(node):
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
            else None

    def added(node):  # a + b + c -> [a, b, c]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return added(node.left) + added(node.right)
        return [node]

    def beside(parts, line):
        for i, part in enumerate(parts):
            t = text(part)
            if t is None or "@" not in t:
                continue
            if t.startswith("@") and i > 0:
                yield src(parts[i - 1]), line
            if t.endswith("@") and i + 1 < len(parts):
                yield src(parts[i + 1]), line

    chained = set()
    for node in nodes:
        if isinstance(node, ast.JoinedStr):
            yield from beside(node.values, node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and id(node) not in \
                chained:
            parts = added(node)
            chained |= {id(n) for n in ast.walk(node) if isinstance(n, ast.BinOp)}
            yield from beside(parts, node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and \
                any(m in (text(node.left) or "") for m in ("@%", "s@")):
            yield src(node.right), node.lineno
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "format" and text(node.func.value) is not None
              and ("}@" in node.func.value.value or "@{" in node.func.value.value)):
            yield src(node), node.lineno


def test_name_at_layer_is_joined_only_in_model_ref():
    """DESIGN.md convention 4: a node, buffer or weight instance is ``name@layer`` everywhere,
    printed by :class:`firscope.model.ref.Ref` (and parsed there); nothing else glues a name
    to '@' and a layer, so the spelling cannot drift."""
    found = []
    for module, path in MODULES.items():
        rel = str(path.relative_to(REPO))
        if rel == "firscope/model/ref.py":
            continue
        for joined, line in _joins_at(walked(path)):
            if (rel, joined) not in NOT_A_LAYER:
                found.append(f"{rel}:{line}: '@' joined to {joined}")
    assert not found, ("use str(Ref(name, layer)) (firscope/model/ref.py), or add the site "
                       "to NOT_A_LAYER saying why it is no layer:\n" + "\n".join(found))


def test_the_at_check_sees_each_way_of_joining():
    """The check itself: an f-string either side of '@', a concatenation and a format."""
    code = ('a = f"{n}@{lay}"\nb = n + "@" + str(lay)\nc = "{}@{}".format(n, lay)\n'
            'd = f"drop the @{lay}"\ne = f"e.g. {n}@0"\nf = "%s@%d" % (n, lay)\n')
    joined = [j for j, _ in _joins_at(ast.walk(ast.parse(code)))]
    assert {"n", "lay", "str(lay)", "'{}@{}'.format(n, lay)", "(n, lay)"} <= set(joined)
    assert sum(1 for j in joined if j == "lay") >= 2 and "n" in joined


# -- nothing defined at module level that nothing uses -----------------------------------------
# A module-level function or class is used when its name is read somewhere in firscope/,
# tests/, benchmarks/ or screenshots/ (a Name or an attribute, not only an import or __all__),
# or when pyproject.toml's entry points name it. These are kept unused on purpose:
UNUSED_ON_PURPOSE = {
}


def _entry_point_names() -> set[str]:
    """The functions ``[project.scripts]`` names (``firscope = "firscope.cli:main"``); read
    without tomllib, which Python 3.10 lacks."""
    import re
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    targets = re.findall(r'=\s*"[^":]+:([A-Za-z_][A-Za-z0-9_.]*)"', section.group(1)) \
        if section else []
    return {t.split(".")[0] for t in targets}


def unused_definitions() -> list[tuple[str, int, str]]:
    """(file, line, name) of every module-level def or class in firscope/ whose name is read
    nowhere (the check vulture makes, limited to what it is sure of)."""
    defined, read = [], set(_entry_point_names())
    for folder in ("firscope", "tests", "benchmarks", "screenshots"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = parsed(path)
            if folder == "firscope":
                defined += [(str(path.relative_to(REPO)), node.lineno, node.name)
                            for node in tree.body
                            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.ClassDef))]
            for node in walked(path):
                if isinstance(node, ast.Name):
                    read.add(node.id)
                elif isinstance(node, ast.Attribute):
                    read.add(node.attr)
    return [(f, line, name) for f, line, name in defined
            if name not in read and not (name.startswith("__") and name.endswith("__"))]


def test_no_unused_module_level_function_or_class():
    unused = [(f, line, name) for f, line, name in unused_definitions()
              if name not in UNUSED_ON_PURPOSE]
    assert not unused, ("defined and never used (delete it, or add it to UNUSED_ON_PURPOSE "
                        "saying why):\n" + "\n".join(f"{f}:{line}: {name}"
                                                     for f, line, name in unused))
    names = {name for _, _, name in unused_definitions()}
    stale = sorted(set(UNUSED_ON_PURPOSE) - names)
    assert not stale, f"used now or gone: remove from UNUSED_ON_PURPOSE: {stale}"


def test_the_unused_check_sees_a_function_nobody_calls(tmp_path, monkeypatch):
    """The check itself, on a tiny tree: one function called, one not, one only imported."""
    (tmp_path / "firscope").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n'
                                             '[project.scripts]\nx = "firscope.a:main"\n')
    (tmp_path / "firscope" / "a.py").write_text(
        "def main():\n    helper()\n\ndef helper():\n    pass\n\ndef lonely():\n    pass\n"
        "class Gone:\n    pass\n")
    (tmp_path / "tests" / "t.py").write_text("from firscope.a import Gone\n")
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    assert [name for _, _, name in unused_definitions()] == ["lonely", "Gone"]


# -- front ends drive the engine through the typed debugger API ---------------------------------
FRONT_ENDS = ("tui", "dap", "api")
# The calls that hand a command line to the text interpreter.
TEXT_ENTRY_POINTS = {"run", "execute", "run_command"}


def formatted_command_lines(path: Path) -> list[str]:
    """Calls in ``path`` that give the text interpreter a line the code wrote itself: an
    f-string, a string literal, a ``+`` or ``%`` of text, or a ``.format``. A line the user
    typed arrives as a variable (the console, the palette, the DAP REPL) and is not flagged."""
    def written(node) -> bool:
        if isinstance(node, ast.JoinedStr):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
            return written(node.left) or written(node.right)
        if isinstance(node, ast.IfExp):
            return written(node.body) or written(node.orelse)
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "format")

    found = []
    for node in walked(path):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if name in TEXT_ENTRY_POINTS and any(written(a) for a in node.args):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_front_ends_call_the_typed_api_not_command_lines():
    """Issue 41: what the UI, DAP and the Python API do for their own keys, clicks and
    requests calls the typed :class:`firscope.debug.debugger.Debugger` (as pdb calls bdb);
    only text a user typed goes through the text commands."""
    bad = []
    for part in FRONT_ENDS:
        for path in sorted((PKG / part).rglob("*.py")):
            bad += [f"{path.relative_to(REPO)} {f}" for f in formatted_command_lines(path)]
    assert not bad, "front ends format command lines:\n" + "\n".join(bad)


def test_the_command_line_scan_sees_each_way_of_formatting(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(ci, app, n, typed):\n"
                    "    ci.run(f'lane {n}')\n"
                    "    ci.execute('continue')\n"
                    "    app.run_command('goto ' + n)\n"
                    "    ci.run('break {}'.format(n))\n"
                    "    ci.run(typed if n else 'delete')\n"
                    "    ci.run(typed)\n"            # what the user typed: fine
                    "    app.run()\n"
                    "    ci.goto(n)\n")
    assert [int(f.split(":")[0].split()[1]) for f in formatted_command_lines(path)] == [2, 3, 4, 5, 6]


def test_each_engine_names_a_machine_class_and_its_module_imports_no_engine():
    """Issue 44.6: the engines are declared once (firscope/engines.py, layer 0, importing
    nothing of firscope); each spec's ``module:Class`` is a Machine that takes the one
    constructor's arguments."""
    import inspect

    from firscope.engines import ENGINE_SPECS, machine_class
    from firscope.runtime.machine import Machine
    assert {d for d in GRAPH["firscope.engines"] if d.startswith("firscope")} <= {
        "firscope.errors"}  # for its messages
    for name, spec in ENGINE_SPECS.items():
        cls = machine_class(name)
        assert issubclass(cls, Machine), name
        params = inspect.signature(cls.__init__).parameters
        assert {"engine", "hooks", "budget"} <= set(params), name


# Classes whose private methods nothing outside their module calls (issue 45: benchmarks
# and tests reached into Machine._calls and CompiledRunner._plain_bound for want of
# Machine.bound_calls). A module's own test file (tests/test_compiled.py for
# vm/compiled.py) may still replace one with a test double.
PRIVATE_OWNERS = {"firscope/runtime/machine.py": "Machine",
                  "firscope/vm/compiled.py": "CompiledRunner"}


def test_no_private_method_of_the_engines_is_used_outside_its_module():
    private: dict[str, str] = {}
    for rel, cls in PRIVATE_OWNERS.items():
        for node in walked(REPO / rel):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                private.update({b.name: rel for b in node.body
                                if isinstance(b, ast.FunctionDef) and b.name.startswith("_")
                                and not b.name.startswith("__")})
    assert {"_execute", "_plain_bound"} <= set(private)
    files = [*PKG.rglob("*.py"), *(REPO / "benchmarks").glob("*.py"),
             *(REPO / "tests").glob("*.py")]
    bad = []
    for path in files:
        rel = str(path.relative_to(REPO))
        for node in walked(path):
            if not (isinstance(node, ast.Attribute) and node.attr in private):
                continue
            owner = private[node.attr]
            if rel == owner or rel == f"tests/test_{Path(owner).stem}.py":
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue  # a subclass's own (GpuMachine._execute)
            bad.append(f"{rel}:{node.lineno} uses {node.attr}")
    assert not bad, bad
