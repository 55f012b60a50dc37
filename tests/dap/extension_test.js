// Loads editors/vscode/extension.js against a stand-in for VS Code's `vscode` module and
// checks what it registers: the `firscope` debug type starts `firscope dap`, and F5 on a
// .fir file without a launch.json debugs that file. Run by tests/test_editor.py.
'use strict';

const assert = require('node:assert/strict');
const Module = require('node:module');
const path = require('node:path');

const registered = {};
let setting = undefined;
let activeEditor;
class DebugAdapterExecutable {
  constructor(command, args, options) { Object.assign(this, { command, args, options }); }
}
let lensSetting;
const started = [];
class Range { constructor(...a) { this.args = a; } }
class CodeLens { constructor(range, command) { Object.assign(this, { range, command }); } }
const vscode = {
  DebugAdapterExecutable, Range, CodeLens,
  workspace: {
    getConfiguration: (section) => ({ get: (key) => (section !== 'firscope' ? undefined
      : key === 'path' ? setting : key === 'codeLens' ? lensSetting : undefined) }),
    getWorkspaceFolder: (uri) => ({ uri: { fsPath: path.dirname(uri.fsPath) } }),
  },
  window: {
    get activeTextEditor() { return activeEditor; },
    showInformationMessage: (msg) => { registered.message = msg; return Promise.resolve(); },
  },
  debug: {
    registerDebugAdapterDescriptorFactory: (type, f) => { registered.factory = [type, f]; return {}; },
    registerDebugConfigurationProvider: (type, p) => { registered.provider = [type, p]; return {}; },
    startDebugging: (folder, config) => { started.push([folder, config]); return Promise.resolve(true); },
  },
  commands: { registerCommand: (name, f) => { registered.command = [name, f]; return {}; } },
  languages: {
    registerCodeLensProvider: (selector, p) => { registered.lens = [selector, p]; return {}; },
  },
};
const load = Module._load;
Module._load = function (request, ...rest) {
  return request === 'vscode' ? vscode : load.call(this, request, ...rest);
};

async function main() {
  const ext = require(path.resolve(__dirname, '../../editors/vscode/extension.js'));
  const context = { subscriptions: [] };
  ext.activate(context);
  assert.equal(context.subscriptions.length, 4);
  const [type, factory] = registered.factory;
  assert.equal(type, 'firscope');
  let d = factory.createDebugAdapterDescriptor({ configuration: {},
    workspaceFolder: { uri: { fsPath: '/w' } } });
  assert.ok(d instanceof DebugAdapterExecutable);
  assert.equal(d.command, 'firscope');
  assert.deepEqual(d.args, ['dap']);
  assert.deepEqual(d.options, { cwd: '/w' });
  setting = '/opt/venv/bin/firscope';
  d = factory.createDebugAdapterDescriptor({ configuration: {} });
  assert.equal(d.command, '/opt/venv/bin/firscope');
  d = factory.createDebugAdapterDescriptor({ configuration: { firscopePath: '/x/firscope' } });
  assert.equal(d.command, '/x/firscope');

  const [ptype, provider] = registered.provider;
  assert.equal(ptype, 'firscope');
  activeEditor = { document: { languageId: 'fir', uri: { fsPath: '/m/gpt2.fir' } } };
  const cfg = provider.resolveDebugConfiguration(undefined, {});
  assert.deepEqual(cfg, { type: 'firscope', name: 'Debug gpt2.fir', request: 'launch',
    model: '/m/gpt2.fir', stopOnEntry: true });

  // "firscope: Debug this model file": the lens's file, else the active .fir editor
  const [cmd, debugFile] = registered.command;
  assert.equal(cmd, 'firscope.debugFile');
  assert.equal(await debugFile({ fsPath: '/n/other.fir' }), true);
  assert.deepEqual(started.pop(), [{ uri: { fsPath: '/n' } }, { type: 'firscope',
    name: 'Debug other.fir', request: 'launch', model: '/n/other.fir', stopOnEntry: true }]);
  await debugFile(undefined);
  assert.equal(started.pop()[1].model, '/m/gpt2.fir');
  const [selector, lens] = registered.lens;
  assert.deepEqual(selector, { language: 'fir' });
  const doc = { uri: { fsPath: '/m/gpt2.fir' } };
  const [l] = lens.provideCodeLenses(doc);
  assert.deepEqual(l.range.args, [0, 0, 0, 0]);
  assert.equal(l.command.command, 'firscope.debugFile');
  assert.deepEqual(l.command.arguments, [doc.uri]);
  assert.match(l.command.title, /Debug this model file/);
  lensSetting = false;
  assert.deepEqual(lens.provideCodeLenses(doc), []);

  activeEditor = undefined;
  assert.equal(await provider.resolveDebugConfiguration(undefined, {}), undefined);
  assert.match(registered.message, /set "model"/);
  assert.equal(await debugFile(undefined), false);
  assert.match(registered.message, /open a \.fir file/);
  assert.equal(started.length, 0);
  console.log('ok extension');
}

main().catch((e) => { console.error(e.stack || e); process.exit(1); });
