// Scenarios that drive `firscope dap` with VS Code's own DAP test client
// (@vscode/debugadapter-testsupport's DebugClient): each scenario starts an adapter process
// over stdio, or with --port connects to a running `firscope dap --port` server (a session
// of its own there).
//
//   node scenarios.js --firscope PATH --scenario NAME --model FILE.fir [--port N --token T]
//
// Exit 0 when the scenario's assertions hold; otherwise the failure is printed
// and the exit code is 1. tests/test_dap.py runs each scenario from pytest.
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { DebugClient } = require('@vscode/debugadapter-testsupport');

const TIMEOUT = 120000; // model loads and first kernel compiles on a busy 2-core machine

function options(argv) {
  const out = {};
  for (let i = 2; i < argv.length; i += 2) {
    out[argv[i].replace(/^--/, '')] = argv[i + 1];
  }
  return out;
}

const opts = options(process.argv);
const MODEL = path.resolve(opts.model);
const LINES = fs.readFileSync(MODEL, 'utf8').split('\n');

// The 1-based line of the first line whose text (trimmed) is `text`, at or after `after`.
function lineOf(text, after = 1) {
  for (let i = after - 1; i < LINES.length; i++) {
    if (LINES[i].trim() === text) return i + 1;
  }
  throw new Error(`no line '${text}' in ${MODEL}`);
}

function lineStarting(prefix) {
  const i = LINES.findIndex((l) => l.startsWith(prefix));
  if (i < 0) throw new Error(`no line starting '${prefix}'`);
  return i + 1;
}

// ---------------------------------------------------------------- helpers
// initialize, launch, configure, configurationDone; resolves to the first stopped event
// (or, with `wait` false, as soon as configurationDone is answered).
// stopOnEntry is false here unless a scenario says otherwise (the adapter's default is true).
async function start(dc, launch, configure, wait = true, init = undefined) {
  const initialized = dc.waitForEvent('initialized', TIMEOUT);
  const caps = await dc.initializeRequest(init);
  assert.equal(caps.body.supportsStepBack, true);
  assert.equal(caps.body.supportsDataBreakpoints, true);
  assert.equal(caps.body.supportsLogPoints, true);
  // over TCP the server's token (`firscope dap --port` prints it; --token here)
  await dc.launchRequest({ model: MODEL, engine: 'interp', steps: 2, stopOnEntry: false,
    ...(opts.token ? { token: opts.token } : {}), ...launch });
  await initialized;
  if (configure) await configure();
  const stopped = wait ? dc.waitForEvent('stopped', TIMEOUT) : null;
  await dc.configurationDoneRequest();
  return wait ? stopped : null;
}

async function resume(dc, request, args) {
  const stopped = dc.waitForEvent('stopped', TIMEOUT);
  await dc[request](args);
  return stopped;
}

async function top(dc, threadId) {
  const st = await dc.stackTraceRequest({ threadId });
  return st.body.stackFrames;
}

async function scope(dc, frameId, prefix) {
  const scopes = (await dc.scopesRequest({ frameId })).body.scopes;
  const s = scopes.find((x) => x.name.startsWith(prefix));
  assert.ok(s, `no scope '${prefix}' in ${scopes.map((x) => x.name)}`);
  return s;
}

async function vars(dc, ref, extra = {}) {
  return (await dc.variablesRequest({ variablesReference: ref, ...extra })).body.variables;
}

function byName(list, name) {
  const v = list.find((x) => x.name === name);
  assert.ok(v, `no variable '${name}' in ${list.map((x) => x.name).slice(0, 20)}`);
  return v;
}

async function evaluate(dc, expression, frameId, context = 'watch') {
  return (await dc.evaluateRequest({ expression, frameId, context })).body;
}

async function lineBreakpoints(dc, lines, extra = {}) {
  const r = await dc.setBreakpointsRequest({
    source: { path: MODEL }, breakpoints: lines.map((line) => ({ line, ...extra })),
  });
  return r.body.breakpoints;
}

// ---------------------------------------------------------------- scenarios
const scenarios = {};

scenarios.entry = async (dc) => {
  const ev = await start(dc, { stopOnEntry: true });
  assert.equal(ev.body.reason, 'entry');
  assert.equal(ev.body.threadId, 1);
  const threads = (await dc.threadsRequest()).body.threads;
  assert.deepEqual(threads, [{ id: 1, name: 'graph' }]);
  const frames = await top(dc, 1);
  assert.equal(frames[0].line, lineStarting('node token ext'));
  assert.equal(frames[0].source.path, MODEL);
  assert.match(frames[0].name, /^before token /);
  assert.match(frames[1].name, /^token 0 /);
};

scenarios.line_breakpoint_every_layer = async (dc) => {
  const line = lineOf('cmplt 4 10 3', lineStarting('kernel g2.attn_decode'));
  let verified;
  const ev = await start(dc, { stopOnEntry: false }, async () => {
    verified = await lineBreakpoints(dc, [line]);
  });
  assert.equal(verified[0].verified, true);
  assert.equal(verified[0].line, line);
  assert.equal(verified[0].source.path, MODEL);
  const layers = [];
  let e = ev;
  for (let i = 0; i < 5; i++) {
    assert.equal(e.body.reason, 'breakpoint');
    assert.deepEqual(e.body.hitBreakpointIds, [verified[0].id]);
    const frames = await top(dc, e.body.threadId);
    assert.equal(frames[0].line, line, 'the top frame is the line about to execute');
    const node = frames.find((f) => f.name.startsWith('attention@'));
    assert.equal(node.line, lineStarting('node attention micro'));
    layers.push(node.name.split(' ')[0]);
    e = await resume(dc, 'continueRequest', { threadId: e.body.threadId });
  }
  // every layer of token 0, then layer 0 of token 1
  assert.deepEqual(layers, ['attention@0', 'attention@1', 'attention@2', 'attention@3',
    'attention@0']);
};

scenarios.conditions_and_hit_counts = async (dc) => {
  const line = lineOf('cmplt 4 10 3', lineStarting('kernel g2.attn_decode'));
  let bps;
  const ev = await start(dc, {}, async () => {
    bps = (await dc.setBreakpointsRequest({
      source: { path: MODEL },
      breakpoints: [{ line, hitCondition: '3' }, { line: 2 }],
    })).body.breakpoints;
  });
  assert.equal(bps[0].verified, true);
  assert.equal(bps[1].verified, false, 'a header line has no instruction or node');
  assert.match(bps[1].message, /not inside a kernel or on a node/);
  let frames = await top(dc, ev.body.threadId);
  assert.ok(frames.some((f) => f.name.startsWith('attention@2')), 'hit 3 is layer 2');
  // replace: a condition instead of a hit count
  bps = await lineBreakpoints(dc, [line], { condition: 'layer == 1' });
  const e = await resume(dc, 'continueRequest', { threadId: ev.body.threadId });
  frames = await top(dc, e.body.threadId);
  assert.ok(frames.some((f) => f.name.startsWith('attention@1')), frames.map((f) => f.name));
  const tok = frames[frames.length - 1].name;
  assert.match(tok, /^token 1 /, 'layer 1 again only in the next token');
  await assert.rejects(lineBreakpoints(dc, [line], { condition: 'R99 > 0' }).then((b) => {
    if (!b[0].verified) throw new Error(b[0].message);
  }), /R99/);
  // a `node` line of the graph stops before that node, in every layer
  const gelu = lineStarting('node gelu micro');
  const [nodeBp] = await lineBreakpoints(dc, [gelu]);
  assert.equal(nodeBp.verified, true);
  assert.equal(nodeBp.line, gelu);
  const seen = [];
  let g = await resume(dc, 'continueRequest', { threadId: e.body.threadId });
  for (let i = 0; i < 3; i++) {
    assert.equal(g.body.reason, 'breakpoint');
    assert.equal(g.body.threadId, 1, 'between nodes: the graph thread');
    const f = (await top(dc, 1))[0];
    assert.equal(f.line, gelu);
    seen.push(f.name.split(' ')[1]);
    g = await resume(dc, 'continueRequest', { threadId: 1 });
  }
  assert.deepEqual(seen, ['gelu@1', 'gelu@2', 'gelu@3']);
};

scenarios.function_breakpoint = async (dc) => {
  let fbs;
  // the compiled engine runs the nodes before the breakpoint whole
  const ev = await start(dc, { engine: 'compiled' }, async () => {
    fbs = (await dc.setFunctionBreakpointsRequest({
      breakpoints: [{ name: 'attention@2' }, { name: 'nosuchnode' }],
    })).body.breakpoints;
  });
  assert.equal(fbs[0].verified, true);
  assert.equal(fbs[1].verified, false);
  assert.match(fbs[1].message, /no node named 'nosuchnode'/);
  assert.equal(ev.body.reason, 'function breakpoint');
  assert.equal(ev.body.threadId, 1);
  const frames = await top(dc, 1);
  assert.match(frames[0].name, /^before attention@2 /);
  assert.equal(frames[0].line, lineStarting('node attention micro'));
};

scenarios.step_in_to_first_instruction = async (dc) => {
  const ev = await start(dc, {}, async () => {
    await dc.setFunctionBreakpointsRequest({ breakpoints: [{ name: 'ln1@0' }] });
  });
  assert.equal(ev.body.threadId, 1);
  const e = await resume(dc, 'stepInRequest', { threadId: 1 });
  assert.equal(e.body.reason, 'step');
  assert.equal(e.body.threadId, 2, 'inside a kernel the focused lane 0 is thread 2');
  const header = lineStarting('kernel g2.layernorm');
  const frames = await top(dc, 2);
  assert.equal(frames[0].line, header + 1, 'stopped before the first instruction');
  assert.match(frames[0].name, /^g2\.layernorm pc 0 /);
  assert.ok(frames.some((f) => f.name.startsWith('ln1@0')));
  // nothing ran yet: R15 is still 0, and next (one instruction) loads it
  const regs = await vars(dc, (await scope(dc, frames[0].id, 'Registers')).variablesReference);
  assert.equal(byName(regs, 'R15').value, '0');
  const n = await resume(dc, 'nextRequest', { threadId: 2 });
  const f2 = await top(dc, n.body.threadId);
  assert.equal(f2[0].line, header + 2);
  const r2 = await vars(dc, (await scope(dc, f2[0].id, 'Registers')).variablesReference);
  assert.equal(byName(r2, 'R15').value, '128');
  assert.deepEqual(byName(r2, 'R15').presentationHint.attributes, ['changed']);
  // stepOut finishes the kernel: before the next node, on the graph thread
  const o = await resume(dc, 'stepOutRequest', { threadId: 2 });
  assert.equal(o.body.threadId, 1);
  assert.match((await top(dc, 1))[0].name, /^before qkv_linear@0 /);
};

scenarios.lane_registers = async (dc) => {
  const line = lineOf('cmplt 4 10 3', lineStarting('kernel g2.attn_decode'));
  await start(dc, {}, () => lineBreakpoints(dc, [line]));
  const threads = (await dc.threadsRequest()).body.threads;
  assert.deepEqual(threads.map((t) => t.name), ['graph', 'lane 0', 'lane 1', 'lane 2', 'lane 3']);
  const lane1 = threads.find((t) => t.name === 'lane 1').id;
  const frames = await top(dc, lane1);
  assert.match(frames.find((f) => f.name.startsWith('g2.attn_decode')).name, /lane 1 of 4/);
  const sc = await scope(dc, frames[0].id, 'Registers (lane 1)');
  const regs = await vars(dc, sc.variablesReference);
  assert.equal(regs.length, 64);
  assert.equal(byName(regs, 'R0').value, '1', 'R0 holds the lane id');
  assert.equal(byName(regs, 'U0').value, '1', 'rtou 0 0 copied it');
  assert.equal(byName(regs, 'U1').value, String(1 * 32), 'umulk 1 0 headdim');
  assert.equal(byName(regs, 'U2').value, String(1 * 256), 'umulk 2 0 positions');
  assert.ok(byName(regs, 'U1').presentationHint.attributes.includes('changed'));
  assert.equal(byName(regs, 'U9').presentationHint, undefined);
  // the same register through evaluate in that lane's frame, and lane 0 differs
  assert.equal((await evaluate(dc, 'U1', frames[0].id)).result, '32');
  const f0 = await top(dc, threads.find((t) => t.name === 'lane 0').id);
  const r0 = await vars(dc, (await scope(dc, f0[0].id, 'Registers (lane 0)')).variablesReference);
  assert.equal(byName(r0, 'U1').value, '0');
  // setVariable writes lane 1's register (the `set` command), and reads back
  const set = await dc.setVariableRequest({ variablesReference: sc.variablesReference,
    name: 'R12', value: '2.5' });
  assert.equal(set.body.value, '2.5');
  assert.equal((await evaluate(dc, 'R12', frames[0].id)).result, '2.5');
  assert.notEqual((await evaluate(dc, 'R12', f0[0].id)).result, '2.5');
  // and an element of a buffer, from the Buffers scope
  const buffers = await vars(dc, (await scope(dc, frames[0].id, 'Buffers')).variablesReference);
  const x = byName(buffers, 'x');
  const setX = await dc.setVariableRequest({ variablesReference: x.variablesReference,
    name: '[3]', value: '1.25' });
  assert.equal(setX.body.value, '1.25');
  assert.equal((await evaluate(dc, 'x[3]', frames[0].id)).result, '1.25');
  const again = await vars(dc, x.variablesReference, { start: 3, count: 1 });
  assert.equal(again[0].value, '1.25');
  // a weight, from the Weights scope, is written with `set --weight`
  const weights = await vars(dc, (await scope(dc, frames[0].id, 'Weights')).variablesReference);
  const layers = await vars(dc, byName(weights, 'qkvb').variablesReference);
  const qkvb0 = byName(layers, '@0');
  assert.equal(qkvb0.evaluateName, 'qkvb@0');
  const setW = await dc.setVariableRequest({ variablesReference: qkvb0.variablesReference,
    name: '[7]', value: '-0.5' });
  assert.equal(setW.body.value, '-0.5');
  assert.equal((await evaluate(dc, 'qkvb@0[7]', frames[0].id)).result, '-0.5');
};

scenarios.paging = async (dc) => {
  // this model's vocabulary is 50257: one step fills logits
  const ev = await start(dc, { tokens: [5, 7], steps: 1 }, async () => {
    await dc.setFunctionBreakpointsRequest({ breakpoints: [{ name: 'token 1' }] });
  });
  const frames = await top(dc, ev.body.threadId);
  const buffers = await vars(dc, (await scope(dc, frames[0].id, 'Buffers')).variablesReference);
  const logits = byName(buffers, 'logits');
  assert.equal(logits.indexedVariables, 50257);
  assert.match(logits.value, /^f32\[50257\] \[/);
  // a paging client (VS Code) gets exactly the slice it asks for
  const page = await vars(dc, logits.variablesReference,
    { filter: 'indexed', start: 50200, count: 57 });
  assert.deepEqual(page.map((v) => v.name), Array.from({ length: 57 }, (_, i) => `[${50200 + i}]`));
  for (const i of [0, 13, 56]) {
    const v = page[i];
    assert.equal(v.evaluateName, `logits[${50200 + i}]`);
    assert.equal((await evaluate(dc, v.evaluateName, frames[0].id)).result, v.value);
  }
  assert.ok(page.some((v) => v.value !== '0'), 'logits were computed');
  // a client that does not page gets at most 100 groups, nested down to elements
  const groups = await vars(dc, logits.variablesReference);
  assert.ok(groups.length <= 100 && groups.length > 1, `${groups.length} groups`);
  assert.deepEqual(groups.map((g) => g.name), ['[0:10000]', '[10000:20000]', '[20000:30000]',
    '[30000:40000]', '[40000:50000]', '[50000:50257]']);
  const last = await vars(dc, groups[groups.length - 1].variablesReference);
  assert.equal(last[last.length - 1].name, '[50200:50257]');
  const leaves = await vars(dc, last[last.length - 1].variablesReference);
  assert.equal(leaves.length, 57);
  assert.deepEqual(leaves.map((v) => v.value), page.map((v) => v.value));
  // readMemory of the same elements, as f32 bytes
  const mem = await dc.customRequest('readMemory', { memoryReference: logits.memoryReference,
    offset: 50200 * 4, count: 57 * 4 });
  const bytes = Buffer.from(mem.body.data, 'base64');
  assert.equal(bytes.length, 57 * 4);
  for (const i of [0, 56]) {
    const f = bytes.readFloatLE(i * 4);
    assert.equal(Math.fround(Number(page[i].value)), f);
  }
};

scenarios.step_back_restores_register = async (dc) => {
  const header = lineStarting('kernel g2.attn_decode');
  const line = lineOf('mulconst 3 3 1/sqrt(headdim)', header);
  const ev = await start(dc, {}, () => lineBreakpoints(dc, [line]));
  const thread = ev.body.threadId;
  const read = async () => {
    const frames = await top(dc, thread);
    return { line: frames[0].line, value: (await evaluate(dc, 'R3', frames[0].id)).result };
  };
  const before = await read();
  assert.equal(before.line, line);
  assert.notEqual(before.value, '0');
  await resume(dc, 'nextRequest', { threadId: thread });
  const after = await read();
  assert.equal(after.line, line + 1);
  assert.equal(Math.fround(Number(after.value)),
    Math.fround(Math.fround(Number(before.value)) * Math.fround(1 / Math.sqrt(32))));
  const back = await resume(dc, 'stepBackRequest', { threadId: thread });
  assert.equal(back.body.reason, 'step');
  assert.deepEqual(await read(), before, 'stepBack restores R3 and the line');
  // reverseContinue from inside the kernel goes back to the start of the recorded history
  const rc = await resume(dc, 'reverseContinueRequest', { threadId: thread });
  assert.equal(rc.body.threadId, 1);
  assert.match((await top(dc, 1))[0].name, /^before token /);
};

scenarios.nan_exception = async (dc) => {
  let filters;
  const ev = await start(dc, {}, async () => {
    filters = await dc.setExceptionBreakpointsRequest({ filters: ['nan', 'fault'] });
  });
  assert.equal(filters.body.breakpoints.length, 2);
  assert.equal(ev.body.reason, 'exception');
  const info = (await dc.exceptionInfoRequest({ threadId: ev.body.threadId })).body;
  assert.equal(info.exceptionId, 'nan');
  assert.match(info.details.stackTrace, /^gelu@0 \(g2\.gelu_new\)/);
  const div = lineOf('div 2 2 9', lineStarting('kernel g2.gelu_new'));
  assert.match(info.details.message, new RegExp(`line ${div} \\(div 2 2 9\\)`));
  const frames = await top(dc, ev.body.threadId);
  assert.equal(frames[0].line, div + 1, 'stopped right after the instruction that wrote it');
  assert.ok(frames.some((f) => f.name.startsWith('gelu@0 ')), frames.map((f) => f.name));
  const r2 = (await evaluate(dc, 'R2', frames[0].id)).result;
  assert.match(r2, /^(nan|inf|-inf)$/);
};

scenarios.evaluate_max_abs = async (dc) => {
  const ev = await start(dc, {}, async () => {
    await dc.setFunctionBreakpointsRequest({ breakpoints: [{ name: 'ln1@1' }] });
  });
  const frames = await top(dc, ev.body.threadId);
  const got = await evaluate(dc, 'max(abs(x))', frames[0].id);
  // the same number from the elements the Variables view shows
  const buffers = await vars(dc, (await scope(dc, frames[0].id, 'Buffers')).variablesReference);
  const x = byName(buffers, 'x');
  assert.equal(x.indexedVariables, 128);
  const elems = await vars(dc, x.variablesReference, { start: 0, count: 128 });
  const expected = Math.max(...elems.map((v) => Math.abs(Number(v.value))));
  assert.equal(Math.fround(Number(got.result)), Math.fround(expected));
  assert.ok(expected > 0);
  // hover over an operand of the next node names its buffer
  const hover = await evaluate(dc, '@in0', frames[0].id, 'hover');
  assert.equal(hover.result, x.value);
  // an array result has paged children
  const arr = await evaluate(dc, 'x[0:10]', frames[0].id);
  assert.equal(arr.indexedVariables, 10);
  const kids = await vars(dc, arr.variablesReference);
  assert.deepEqual(kids.map((v) => v.value), elems.slice(0, 10).map((v) => v.value));
  // the debug console runs firscope commands too
  const info = await evaluate(dc, 'info node', frames[0].id, 'repl');
  assert.match(info.result, /^node ln1@1: micro g2\.layernorm/);
  // ...and a command that runs the model is a movement like the toolbar's
  const moved = await resume(dc, 'evaluateRequest', { expression: 'stepi', context: 'repl',
    frameId: frames[0].id });
  assert.equal(moved.body.reason, 'step');
  assert.match((await top(dc, moved.body.threadId))[0].name, /^g2\.layernorm pc 1 /);
};

scenarios.bad_requests = async (dc) => {
  const line = lineOf('cmplt 4 10 3', lineStarting('kernel g2.attn_decode'));
  const ev = await start(dc, { stopOnEntry: true });
  await assert.rejects(dc.customRequest('bogus'), /unknown request 'bogus'/);
  await assert.rejects(dc.stackTraceRequest({ threadId: 'one' }), /threadId/);
  await assert.rejects(dc.variablesRequest({ variablesReference: 99999 }), /not valid/);
  await assert.rejects(dc.evaluateRequest({ expression: 'nosuch + 1', context: 'watch' }),
    /nosuch/);
  await assert.rejects(dc.evaluateRequest({ expression: 'x[', context: 'watch' }));
  // stepping back at the very start is a stop that says so, not an error
  const back = await resume(dc, 'stepBackRequest', { threadId: 1 });
  assert.equal(back.body.description, 'no more history');
  // a broken frame on the wire is reported and skipped
  const out = dc.waitForEvent('output', TIMEOUT);
  dc._adapterProcess.stdin.write('Content-Length: 5\r\n\r\nhello');
  assert.match((await out).body.output, /malformed message/);
  // ...and the session goes on
  const bps = await lineBreakpoints(dc, [line]);
  assert.equal(bps[0].verified, true);
  const e = await resume(dc, 'continueRequest', { threadId: ev.body.threadId });
  assert.equal(e.body.reason, 'breakpoint');
  assert.equal((await top(dc, e.body.threadId))[0].line, line);
};

scenarios.data_breakpoint = async (dc) => {
  // compiled: the write is found by replaying the node that changed attn in the interpreter
  const ev = await start(dc, { stopOnEntry: true, engine: 'compiled' });
  const frames = await top(dc, 1);
  const buffers = (await scope(dc, frames[0].id, 'Buffers')).variablesReference;
  await vars(dc, buffers);
  const info = (await dc.dataBreakpointInfoRequest({ variablesReference: buffers,
    name: 'attn' })).body;
  assert.equal(info.dataId, 'attn[0:128]');
  const set = (await dc.setDataBreakpointsRequest({ breakpoints: [{ dataId: info.dataId }] }))
    .body.breakpoints;
  assert.equal(set[0].verified, true);
  const e = await resume(dc, 'continueRequest', { threadId: ev.body.threadId });
  assert.equal(e.body.reason, 'data breakpoint');
  const top0 = (await top(dc, e.body.threadId));
  assert.ok(top0.some((f) => f.name.startsWith('attention@0')));
  const store = lineOf('ustoref32 12 5 @out0', lineStarting('kernel g2.attn_decode'));
  assert.equal(top0[0].line, store + 1, 'stopped after the store that changed attn');
};

scenarios.pause = async (dc) => {
  // a long run: interpreted, many tokens, no breakpoints
  await start(dc, { steps: 200 }, null, false);
  await new Promise((r) => setTimeout(r, 1500));
  const stopped = dc.waitForEvent('stopped', TIMEOUT);
  await dc.pauseRequest({ threadId: 1 });
  const e = await stopped;
  assert.equal(e.body.reason, 'pause');
  const frames = await top(dc, e.body.threadId);
  assert.ok(frames.length >= 2);
  const tokens = frames[frames.length - 1].name;
  assert.match(tokens, /^token [0-9]+ /);
  // run on, and disconnect while it runs: the adapter answers and exits cleanly
  await dc.continueRequest({ threadId: e.body.threadId });
  const exited = new Promise((resolve) => dc._adapterProcess.on('exit', (code) => resolve(code)));
  await new Promise((r) => setTimeout(r, 300));
  await dc.disconnectRequest({});
  assert.equal(await exited, 0);
};

scenarios.goto_node = async (dc) => {
  const ev = await start(dc, {}, async () => {
    await dc.setFunctionBreakpointsRequest({ breakpoints: [{ name: 'mlp_residual@1' }] });
  });
  const line = lineStarting('node attention micro');
  const targets = (await dc.gotoTargetsRequest({ source: { path: MODEL }, line })).body.targets;
  assert.deepEqual(targets.map((t) => t.label.split(' ')[0]),
    ['attention@0', 'attention@1', 'attention@2', 'attention@3']);
  const e = await resume(dc, 'gotoRequest', { threadId: ev.body.threadId,
    targetId: targets[0].id });
  assert.equal(e.body.reason, 'goto');
  assert.match((await top(dc, 1))[0].name, /^before attention@0 /);
  // terminate ends the session from the editor's side
  const terminated = dc.waitForEvent('terminated', TIMEOUT);
  await dc.terminateRequest({});
  await terminated;
  await assert.rejects(dc.continueRequest({ threadId: 1 }), /the session has ended/);
};

scenarios.log_points_and_spent_breakpoint = async (dc) => {
  const addLine = lineOf('add 1 1 2', lineStarting('kernel g2.add'));
  const ln1 = lineStarting('node ln1 micro');
  const outputs = [];
  const changed = [];
  dc.on('output', (e) => outputs.push(e.body));
  dc.on('breakpoint', (e) => changed.push(e.body));
  let logBp;
  let hitBp;
  const ev = await start(dc, {}, async () => {
    [logBp, hitBp] = (await dc.setBreakpointsRequest({
      source: { path: MODEL },
      breakpoints: [{ line: addLine, logMessage: 'x+pos lane {lane}: R1={R1}' },
        { line: ln1, hitCondition: '==2' }],
    })).body.breakpoints;
  });
  assert.equal(logBp.verified, true);
  assert.equal(ev.body.reason, 'breakpoint');
  assert.deepEqual(ev.body.hitBreakpointIds, [hitBp.id], 'the log point never stops');
  assert.ok((await top(dc, 1)).some((f) => f.name.startsWith('before ln1@1')));
  const logs = outputs.filter((o) => o.output.startsWith('x+pos lane '));
  assert.ok(logs.length >= 2, JSON.stringify(outputs));
  for (const o of logs) {
    assert.match(o.output, /^x\+pos lane 0: R1=-?[0-9.e+-]+\n$/);
    assert.equal(o.line, addLine);
  }
  assert.equal(changed.length, 1, JSON.stringify(changed));
  assert.equal(changed[0].reason, 'changed');
  assert.equal(changed[0].breakpoint.id, hitBp.id);
  assert.equal(changed[0].breakpoint.verified, false, 'spent: shown grey, not left armed');
};

scenarios.launch_error_is_shown = async (dc) => {
  const outputs = [];
  dc.on('output', (e) => outputs.push(e.body));
  const initialized = dc.waitForEvent('initialized', 10000);
  await dc.initializeRequest();
  await initialized; // right after the initialize answer, before any launch
  // the raw response (launchRequest would turn it into a bare Error): VS Code shows a dialog
  // only for an error whose showUser is not false
  const raw = await new Promise((resolve) => dc.doSend('launch',
    { model: path.join(path.dirname(MODEL), 'nope.fir') }, resolve));
  assert.equal(raw.success, false);
  assert.match(raw.message, /nope\.fir/);
  assert.equal(raw.body.error.showUser, true);
  await new Promise((r) => setTimeout(r, 200));
  const err = outputs.filter((o) => o.category === 'stderr');
  assert.equal(err.length, 1, JSON.stringify(outputs));
  assert.match(err[0].output, /^firscope: .*nope\.fir/);
};

scenarios.zero_based_lines_and_uris = async (dc) => {
  const line = lineOf('cmplt 4 10 3', lineStarting('kernel g2.attn_decode'));
  const uri = require('node:url').pathToFileURL(MODEL).href;
  let bps;
  const ev = await start(dc, {}, async () => {
    bps = (await dc.setBreakpointsRequest({ source: { path: uri },
      breakpoints: [{ line: line - 1 }] })).body.breakpoints;
  }, true, { adapterID: 'firscope', linesStartAt1: false, columnsStartAt1: false,
    pathFormat: 'uri' });
  assert.equal(bps[0].verified, true);
  assert.equal(bps[0].line, line - 1);
  assert.equal(ev.body.reason, 'breakpoint');
  const [frame] = await top(dc, ev.body.threadId);
  assert.equal(frame.line, line - 1);
  assert.equal(frame.column, 0);
  assert.equal(frame.source.path, uri);
};

// ---------------------------------------------------------------- main
async function main() {
  const scenario = scenarios[opts.scenario];
  if (!scenario) throw new Error(`no scenario '${opts.scenario}'`);
  const dc = new DebugClient(opts.firscope, 'dap', 'firscope', { env: process.env }, true);
  dc.defaultTimeout = TIMEOUT;
  await dc.start(opts.port ? Number(opts.port) : undefined);
  try {
    await scenario(dc);
  } finally {
    const proc = dc._adapterProcess;
    if (!proc || proc.exitCode === null) await dc.stop();
  }
  console.log(`ok ${opts.scenario}`);
}

main().then(() => process.exit(0), (err) => {
  console.error(`FAILED ${opts.scenario}: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
});
