// Multi-node on one machine (issue 32 item 5): two `mxserve` processes over TCP on 127.0.0.1 (ports chosen
// here), CPU backend, Gloo between the ranks, tp 2 across 2 nodes (one rank per node).
//  1. greedy tokens: `generate` on node 0 + `serve --node-rank 1` on tests/fixtures/glm4_moe_tiny_a equal the
//     one-rank tokens, and both processes exit 0 (node 0 tells the follower to quit);
//  2. one HTTP request through node 0's server (models/tiny-glm-trained, its tokenizer): the greedy text equals
//     the one-rank generate's tokens detokenized; SIGTERM on node 0 stops both with exit 0;
//  3. start-up failures stop every node naming the culprit, no hang: a follower started with another model
//     (both exit non-zero, named), a follower that never comes (node 0 fails after --dist-timeout naming node 1);
//  4. a node that dies after start-up: the follower killed -> node 0 exits 1 naming node 1; node 0 killed ->
//     the follower exits 1 naming node 0.
// Usage: node multinode_test.mjs MXSERVE_BINARY REPO_ROOT
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';

const [binary, root] = process.argv.slice(2);
const FIXTURE = path.join(root, 'tests/fixtures/glm4_moe_tiny_a');
const TRAINED = path.join(root, 'models/tiny-glm-trained');

const freePort = () => new Promise((resolve, reject) => {
  const s = net.createServer();
  s.on('error', reject);
  s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});

// Spawns mxserve; exited resolves { code, signal, err } (killed after limitMs: the test fails, no hang).
function start(args, limitMs = 120000) {
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  child.stdout.on('data', (d) => { out += d; });
  child.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), limitMs);
    child.on('exit', (code, signal) => { clearTimeout(timer); resolve({ code, signal, out, err }); });
  });
  return { child, exited, log: () => err };
}

const lastIds = (out) => out.trim().split('\n').pop().split(',').map(Number);
const dist = async (rank, extra = []) =>
  ['--tp-size', '2', '--nnodes', '2', '--node-rank', String(rank), ...extra];

async function waitHealthy(base, proc, limitMs = 120000) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r && r.status === 200) return;
    if (Date.now() > deadline) throw new Error('node 0 never became healthy:\n' + proc.log());
    await new Promise((res) => setTimeout(res, 200));
  }
}

const post = async (base, route, body) => {
  const r = await fetch(base + route, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
};

// 1. greedy tokens vs one rank (the fixture).
{
  const ids = ['--ids', '1,2,3,4,5,6,7', '--max-tokens', '6', '--ignore-eos'];
  const one = await start(['generate', '--model', FIXTURE, ...ids]).exited;
  assert.equal(one.code, 0, one.err);
  const addr = `127.0.0.1:${await freePort()}`;
  const follower = start(['serve', '--model', FIXTURE, ...await dist(1), '--dist-init-addr', addr, '--dist-timeout', '60']);
  const leader = start(['generate', '--model', FIXTURE, ...ids, ...await dist(0), '--dist-init-addr', addr,
    '--dist-timeout', '60']);
  const [l, f] = await Promise.all([leader.exited, follower.exited]);
  assert.equal(l.code, 0, 'node 0 generate:\n' + l.err);
  assert.equal(f.code, 0, 'node 1 follower:\n' + f.err);
  assert.deepEqual(lastIds(l.out), lastIds(one.out), 'tp 2 over 2 nodes: greedy tokens equal one rank');
  assert.match(f.err, /node 0 quit after \d+ steps/);
  console.log(`ok: greedy tokens over 2 nodes equal one rank (${lastIds(l.out).join(',')})`);
}

// 2. one request through node 0's HTTP server.
{
  const addr = `127.0.0.1:${await freePort()}`;
  const port = await freePort();
  const common = ['--model', TRAINED, '--dist-init-addr', addr, '--dist-timeout', '60'];
  const follower = start(['serve', ...common, ...await dist(1)]);
  const leader = start(['serve', ...common, ...await dist(0), '--port', String(port), '--kv-cache-memory', '64MiB',
    '--max-model-len', '512', '--stats-interval', '0']);
  const base = `http://127.0.0.1:${port}`;
  await waitHealthy(base, leader);
  const prompt = 'Once upon a time';
  const tok = await post(base, '/tokenize', { prompt });
  assert.equal(tok.status, 200, JSON.stringify(tok.body));
  const c = await post(base, '/v1/completions', { prompt, max_tokens: 6, temperature: 0, ignore_eos: true });
  assert.equal(c.status, 200, JSON.stringify(c.body));
  assert.equal(c.body.usage.completion_tokens, 6);
  const one = await start(['generate', '--model', TRAINED, '--ids', tok.body.tokens.join(','), '--max-tokens', '6',
    '--ignore-eos']).exited;
  assert.equal(one.code, 0, one.err);
  const text = await post(base, '/detokenize', { tokens: lastIds(one.out) });
  assert.equal(text.status, 200, JSON.stringify(text.body));
  assert.equal(c.body.choices[0].text, text.body.prompt, 'the served greedy text equals one rank\'s tokens');
  leader.child.kill('SIGTERM');
  const [l, f] = await Promise.all([leader.exited, follower.exited]);
  assert.equal(l.code, 0, l.err);
  assert.equal(f.code, 0, f.err);
  console.log(`ok: HTTP over 2 nodes: ${JSON.stringify(c.body.choices[0].text)}`);
}

// 3a. a follower started with another model: both stop, named.
{
  const addr = `127.0.0.1:${await freePort()}`;
  const follower = start(['serve', '--model', FIXTURE, ...await dist(1), '--dist-init-addr', addr, '--dist-timeout', '30']);
  const leader = start(['generate', '--model', TRAINED, '--ids', '1,2', ...await dist(0), '--dist-init-addr', addr,
    '--dist-timeout', '30']);
  const [l, f] = await Promise.all([leader.exited, follower.exited]);
  assert.notEqual(l.code, 0);
  assert.notEqual(f.code, 0);
  assert.match(l.err, /node 1 \(ranks 1\.\.1\) was started as \[model .*glm4_moe_tiny_a/);
  assert.match(f.err, /node 0 stopped the launch/);
  console.log('ok: a mismatched follower stops both nodes, named');
}

// 3b. a follower that never comes: node 0 fails after --dist-timeout, naming node 1.
{
  const addr = `127.0.0.1:${await freePort()}`;
  const t0 = Date.now();
  const l = await start(['generate', '--model', FIXTURE, '--ids', '1,2', ...await dist(0), '--dist-init-addr', addr,
    '--dist-timeout', '2'], 60000).exited;
  assert.notEqual(l.code, 0);
  assert.equal(l.signal, null, 'node 0 stopped on its own, not by the test\'s kill');
  assert.match(l.err, /node\(s\) 1 never connected within 2/);
  console.log(`ok: a missing follower fails node 0 in ${((Date.now() - t0) / 1000).toFixed(1)} s, named`);
}

// 4. a node that dies after start-up.
for (const victim of [1, 0]) {
  const addr = `127.0.0.1:${await freePort()}`;
  const port = await freePort();
  const common = ['--model', TRAINED, '--dist-init-addr', addr, '--dist-timeout', '60'];
  const follower = start(['serve', ...common, ...await dist(1)]);
  const leader = start(['serve', ...common, ...await dist(0), '--port', String(port), '--kv-cache-memory', '64MiB',
    '--max-model-len', '512', '--stats-interval', '0']);
  await waitHealthy(`http://127.0.0.1:${port}`, leader);
  const [dead, survivor] = victim === 1 ? [follower, leader] : [leader, follower];
  dead.child.kill('SIGKILL');
  const s = await survivor.exited;
  await dead.exited;
  assert.equal(s.code, 1, `the survivor of node ${victim}'s death exits 1:\n` + s.err);
  assert.equal(s.signal, null);
  if (victim === 1) assert.match(s.err, /node 1 \(ranks 1\.\.1\) stopped/);
  else assert.match(s.err, /node 0 stopped without saying so/);
  console.log(`ok: node ${victim} killed -> the other node exits 1 naming it`);
}
