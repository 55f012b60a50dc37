// The firscope extension: `.fir` files get a language (grammar in syntaxes/), and the
// `firscope` debug type starts `firscope dap` (the DAP server over stdio). Plain
// JavaScript against VS Code's API: nothing to build or install.
'use strict';

const path = require('node:path');
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

// The configuration that debugs one .fir file (F5 without a launch.json, the
// "firscope: Debug this model file" command and its code lens). stopOnEntry is the
// adapter's default too.
function fileConfiguration(fsPath) {
  return { type: 'firscope', name: `Debug ${path.basename(fsPath)}`, request: 'launch',
    model: fsPath, stopOnEntry: true };
}

// F5 on a .fir file without a launch.json debugs that file.
const provider = {
  resolveDebugConfiguration(folder, config) {
    if (!config.type && !config.request && !config.name) {
      const editor = vscode.window.activeTextEditor;
      if (editor && editor.document.languageId === 'fir') {
        Object.assign(config, fileConfiguration(editor.document.uri.fsPath));
      }
    }
    if (!config.model) {
      return vscode.window.showInformationMessage('firscope: set "model" to a .fir file')
        .then(() => undefined);
    }
    return config;
  },
};

// "firscope: Debug this model file": the file given (the code lens, the editor's run menu)
// or the active editor's .fir file.
function debugFile(uri) {
  const editor = vscode.window.activeTextEditor;
  const target = uri && uri.fsPath ? uri
    : editor && editor.document.languageId === 'fir' ? editor.document.uri : undefined;
  if (!target) {
    return vscode.window.showInformationMessage('firscope: open a .fir file to debug it')
      .then(() => false);
  }
  const folder = vscode.workspace.getWorkspaceFolder
    ? vscode.workspace.getWorkspaceFolder(target) : undefined;
  return vscode.debug.startDebugging(folder, fileConfiguration(target.fsPath));
}

// A lens over the first line of every .fir file (the firscope.codeLens setting turns it off).
const lenses = {
  provideCodeLenses(document) {
    if (vscode.workspace.getConfiguration('firscope').get('codeLens') === false) return [];
    const top = new vscode.Range(0, 0, 0, 0);
    return [new vscode.CodeLens(top, { title: '$(debug-alt) Debug this model file',
      command: 'firscope.debugFile', arguments: [document.uri] })];
  },
};

function activate(context) {
  context.subscriptions.push(
    vscode.debug.registerDebugAdapterDescriptorFactory('firscope', factory),
    vscode.debug.registerDebugConfigurationProvider('firscope', provider),
    vscode.commands.registerCommand('firscope.debugFile', debugFile),
    vscode.languages.registerCodeLensProvider({ language: 'fir' }, lenses));
}

function deactivate() {}

module.exports = { activate, deactivate, adapterCommand, fileConfiguration };
