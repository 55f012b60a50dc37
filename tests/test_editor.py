"""editors/vscode: the grammar agrees with the opcode table and highlights the real model
file; the extension's launch attributes are the adapter's; extension.js starts `firscope dap`."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess

import pytest

from conftest import REPO, SEED_FIR
from firscope.dap.launch import LAUNCH_KEYS
from firscope.fir.parser import parse_file
from firscope.fir.syntax import Kernel
from firscope.vm.opcodes import OPCODES

VSCODE = REPO / "editors" / "vscode"
GRAMMAR = json.loads((VSCODE / "syntaxes" / "fir.tmLanguage.json").read_text())
PACKAGE = json.loads((VSCODE / "package.json").read_text())
RULES = GRAMMAR["repository"]["instruction"]["patterns"]


def _generator():
    spec = importlib.util.spec_from_file_location("make_grammar", VSCODE / "make_grammar.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grammar_file_is_what_the_script_generates():
    gen = _generator()
    assert gen.render(gen.build_grammar()) == (VSCODE / "syntaxes" / "fir.tmLanguage.json") \
        .read_text(), "run python editors/vscode/make_grammar.py"


def test_grammar_mnemonics_are_the_opcode_table():
    mnemonics = [re.match(r"\^\\s\*\(([a-z0-9]+)\)", r["match"]).group(1) for r in RULES]
    assert sorted(mnemonics) == sorted(OPCODES)
    for rule in RULES:
        spec = OPCODES[re.match(r"\^\\s\*\(([a-z0-9]+)\)", rule["match"]).group(1)]
        regs = [c["name"] for c in rule["captures"].values() if ".register." in c["name"]]
        wanted = ["variable.other.register." + ("f32" if k[0] == "R" else "u32") + ".fir"
                  for k in spec.operands if k in ("Rd", "Rs", "Ud", "Us")]
        assert regs == wanted, spec.mnemonic


def _match_instruction(line: str):
    hits = [(r, m) for r in RULES if (m := re.match(r["match"], line))]
    assert len(hits) == 1, (line, [r["comment"] for r, _ in hits])
    return hits[0]


def test_every_instruction_of_the_sample_model_is_highlighted_with_its_registers():
    fir = parse_file(SEED_FIR)
    kernels = fir.of(Kernel)
    assert kernels, "the sample has kernels"
    count = 0
    for k in kernels:
        for instr in k.body:
            text = fir.lines[instr.loc.line - 1]
            rule, m = _match_instruction(text)
            spec = OPCODES[instr.mnemonic.text]
            assert m.group(1) == spec.mnemonic
            regs = [m.group(int(i)) for i, c in rule["captures"].items()
                    if ".register." in c["name"]]
            assert regs == [t.text for t, kind in zip(instr.operands, spec.operands)
                            if kind in ("Rd", "Rs", "Ud", "Us")], text
            count += 1
    assert count == sum(len(k.body) for k in kernels) > 50


def test_other_lines_are_directives_kernels_nodes_or_comments():
    rep = GRAMMAR["repository"]
    checks = {"# a comment": "comment", "buf x f32 n_embd": "directive",
              "endkernel": "block", "repeat layers": "block"}
    for text, rule in checks.items():
        r = rep[rule]
        assert re.match(r["match"], text), (text, rule)
    head = "kernel g2.add in=2 out=1 size=in0,in1,out0 threads=out0.size tg=1 tgbytes=16"
    m = re.match(rep["kernel"]["begin"], head)
    assert m.group(2) == "g2.add"
    params = re.findall(rep["kernel"]["patterns"][0]["match"], head)
    assert [p[0] for p in params] == ["in", "out", "size", "threads", "tg", "tgbytes"]
    node = "node attention micro g2.attn_decode qkv position -> attn"
    m = re.match(rep["node"]["begin"], node)
    assert m.groups() == ("node", "attention", "micro", "g2.attn_decode")
    assert re.match(rep["unknown"]["match"], "bogus 1 2")
    assert not any(re.match(r["match"], "bogus 1 2") for r in RULES)
    rule, m = _match_instruction("uloadf32 1 5 @in0+hidden  # q")
    assert m.groups()[1:] == ("1", "5", "@", "in0", "+hidden")


def test_launch_attributes_are_the_adapters():
    (debugger,) = PACKAGE["contributes"]["debuggers"]
    assert debugger["type"] == "firscope"
    props = debugger["configurationAttributes"]["launch"]["properties"]
    assert set(props) - {"firscopePath"} == set(LAUNCH_KEYS)
    assert props["engine"]["enum"] == ["compiled", "interp"]
    snippet = debugger["configurationSnippets"][0]["body"]
    assert snippet["type"] == "firscope" and snippet["request"] == "launch"
    assert {"language": "fir"} in PACKAGE["contributes"]["breakpoints"]
    grammar = PACKAGE["contributes"]["grammars"][0]
    assert (VSCODE / grammar["path"]).exists() and grammar["scopeName"] == GRAMMAR["scopeName"]


def test_extension_starts_firscope_dap():
    node = shutil.which("node")
    if node is None:
        pytest.skip("needs node")
    r = subprocess.run([node, str(REPO / "tests" / "dap" / "extension_test.js")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok extension"


VSCE = VSCODE / "node_modules" / "@vscode" / "vsce" / "vsce"
SHIPPED = {"extension/package.json", "extension/extension.js", "extension/readme.md",
           "extension/LICENSE.txt", "extension/language-configuration.json",
           "extension/syntaxes/fir.tmLanguage.json"}


def _vsce_or_skip() -> str:
    """node, with the pinned @vscode/vsce installed in editors/vscode (its lockfile, as
    tests/dap pins the DAP client); skipped with the reason when node, npm or the npm
    registry is out of reach (a failure under CI)."""
    import os

    def unavailable(message):
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unavailable("building the .vsix needs node and npm (Debian: apt-get install nodejs npm)")
    if not VSCE.exists():
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=VSCODE,
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            unavailable("npm ci in editors/vscode failed (is the npm registry reachable?):\n"
                        + r.stderr[-2000:])
    return node


def test_the_extension_packages_non_interactively(tmp_path):
    """`npm run package`'s command builds the .vsix with no prompt (stdin is closed: a
    prompt would read EOF and refuse), and ships the extension, not its tooling."""
    import zipfile
    node = _vsce_or_skip()
    script = PACKAGE["scripts"]["package"].split()
    assert script[:2] == ["vsce", "package"] and "--out" in script
    args = script[2:script.index("--out")]
    out = tmp_path / "firscope.vsix"
    r = subprocess.run([node, str(VSCE), "package", *args, "--out", str(out)], cwd=VSCODE,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Do you want to continue" not in r.stdout + r.stderr
    assert "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        shipped = json.loads(z.read("extension/package.json"))
        manifest = z.read("extension.vsixmanifest").decode()
    assert {n for n in names if n.startswith("extension/")} == SHIPPED
    assert shipped["version"] == PACKAGE["version"] and shipped["license"] == "MIT"
    assert 'Id="firscope"' in manifest and 'Publisher="firscope"' in manifest


def test_snippets_and_defaults_name_the_open_file_and_stop_on_entry():
    from firscope.dap.launch import DEFAULT_STOP_ON_ENTRY, parse_launch
    (debugger,) = PACKAGE["contributes"]["debuggers"]
    props = debugger["configurationAttributes"]["launch"]["properties"]
    assert props["stopOnEntry"]["default"] is DEFAULT_STOP_ON_ENTRY is True
    assert parse_launch({}).stop_on_entry is DEFAULT_STOP_ON_ENTRY
    assert props["model"]["default"] == "${file}"
    assert debugger["initialConfigurations"][0]["model"] == "${file}"
    assert "workspaceFolder" not in json.dumps(debugger)
    assert debugger["configurationSnippets"][0]["body"]["model"] == '^"\\${file}"'
    (command,) = PACKAGE["contributes"]["commands"]
    assert (command["command"], command["title"], command["category"]) == (
        "firscope.debugFile", "Debug this model file", "firscope")
    ignored = (VSCODE / ".vscodeignore").read_text().split()
    assert "make_grammar.py" in ignored and "node_modules/**" in ignored
