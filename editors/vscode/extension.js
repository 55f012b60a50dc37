// The firscope extension: `.fir` files get a language (grammar in syntaxes/), and the
// `firscope` debug type starts `firscope dap` (the DAP server over stdio). Plain
// JavaScript against VS Code's API: nothing to build or install.
'use strict';

const vscode = require('vscode');

// The adapter: `firscope dap`, from the launch configuration's firscopePath, the
// firscope.path setting, or PATH.
function adapterCommand(configuration) {
  const setting = vscode.workspace.getConfiguration('firscope').get('path');
  return configuration.firscopePath || setting || 'firscope';
}

const factory = {
  createDebugAdapterDescriptor(session) {
    const folder = session.workspaceFolder;
    const options = folder ? { cwd: folder.uri.fsPath } : undefined;
    return new vscode.DebugAdapterExecutable(adapterCommand(session.configuration), ['dap'],
      options);
  },
};

// F5 on a .fir file without a launch.json debugs that file.
const provider = {
  resolveDebugConfiguration(folder, config) {
    if (!config.type && !config.request && !config.name) {
      const editor = vscode.window.activeTextEditor;
      if (editor && editor.document.languageId === 'fir') {
        config.type = 'firscope';
        config.name = 'Debug the .fir model';
        config.request = 'launch';
        config.model = editor.document.uri.fsPath;
        config.stopOnEntry = true;
      }
    }
    if (!config.model) {
      return vscode.window.showInformationMessage('firscope: set "model" to a .fir file')
        .then(() => undefined);
    }
    return config;
  },
};

function activate(context) {
  context.subscriptions.push(
    vscode.debug.registerDebugAdapterDescriptorFactory('firscope', factory),
    vscode.debug.registerDebugConfigurationProvider('firscope', provider));
}

function deactivate() {}

module.exports = { activate, deactivate, adapterCommand };
