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
const vscode = {
  DebugAdapterExecutable,
  workspace: { getConfiguration: (section) => ({ get: (key) => (section === 'firscope' && key === 'path' ? setting : undefined) }) },
  window: {
    get activeTextEditor() { return activeEditor; },
    showInformationMessage: (msg) => { registered.message = msg; return Promise.resolve(); },
  },
  debug: {
    registerDebugAdapterDescriptorFactory: (type, f) => { registered.factory = [type, f]; return {}; },
    registerDebugConfigurationProvider: (type, p) => { registered.provider = [type, p]; return {}; },
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
  assert.equal(context.subscriptions.length, 2);
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
  assert.deepEqual(cfg, { type: 'firscope', name: 'Debug the .fir model', request: 'launch',
    model: '/m/gpt2.fir', stopOnEntry: true });
  activeEditor = undefined;
  assert.equal(await provider.resolveDebugConfiguration(undefined, {}), undefined);
  assert.match(registered.message, /set "model"/);
  console.log('ok extension');
}

main().catch((e) => { console.error(e.stack || e); process.exit(1); });
