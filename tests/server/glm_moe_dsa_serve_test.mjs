// glm_moe_dsa (GLM-5.x: MLA + DSA indexer + MTP) served end to end on the CPU: `mxserve serve` with
// models/tiny-glm-moe-dsa (synthetic weights, 2 layers: a full and a shared indexer layer, index_topk 8 below
// the prompts, index_share_for_mtp_iteration true, the real Qwen3 tokenizer), once plainly and once with MTP
// chain speculation (N = 3, fixed). Completions and chat, streaming and not, single and 4 concurrent: every
// greedy text must be non-empty, streaming must equal non-streaming, and the MTP server's texts must equal
// the plain server's (random drafts are rejected, so this checks the draft / verify path keeps greedy exact).
// Usage: node glm_moe_dsa_serve_test.mjs MXSERVE_BINARY REPO_ROOT
import assert from 'node:assert/strict';

import { startTinyServer } from './start_server.mjs';

const [binary, root] = process.argv.slice(2);
const CONFIG = 'models/tiny-glm-moe-dsa/config.json';

const post = async (base, route, body) => {
  const r = await fetch(base + route, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  if (!body.stream) return { status: r.status, body: await r.json() };
  const raw = await r.text();
  let text = '', done = false, finish = null;
  for (const line of raw.split('\n')) {
    if (!line.startsWith('data: ')) continue;
    if (line === 'data: [DONE]') { done = true; continue; }
    const c = JSON.parse(line.slice(6));
    if (!c.choices?.length) continue;
    text += c.choices[0].text ?? c.choices[0].delta?.content ?? '';
    finish = c.choices[0].finish_reason ?? finish;
  }
  return { status: r.status, text, done, finish };
};

const PROMPTS = [
  'The quick brown fox jumps over the lazy dog while the sparse indexer keeps eight keys',
  'Once upon a time in a land far away there lived a model with latent attention and a draft layer',
  'List the prime numbers below thirty, separated by commas, and then explain why each is prime',
  'Write a haiku about a GPU that serves a mixture of experts with multi-token prediction',
];

async function runAll(extra, label) {
  const { server, base, log } = await startTinyServer(binary, root, extra, { config: CONFIG });
  try {
    const out = {};
    const base_req = { model: 'tiny-glm', max_tokens: 24, temperature: 0, ignore_eos: true };
    for (const stream of [false, true]) {
      const c = await post(base, '/v1/completions', { ...base_req, prompt: PROMPTS[0], stream });
      assert.equal(c.status, 200, `${label} completions stream=${stream}: ${JSON.stringify(c.body)}`);
      out[`cmpl_${stream}`] = stream ? c.text : c.body.choices[0].text;
      if (stream) assert.ok(c.done && c.finish === 'length', `${label}: stream ends with [DONE], finish length`);
      else assert.equal(c.body.usage.completion_tokens, 24);
      const m = await post(base, '/v1/chat/completions',
        { ...base_req, messages: [{ role: 'user', content: PROMPTS[1] }], stream });
      assert.equal(m.status, 200, `${label} chat stream=${stream}: ${JSON.stringify(m.body)}`);
      out[`chat_${stream}`] = stream ? m.text : m.body.choices[0].message.content;
    }
    for (const k of Object.keys(out)) assert.ok(out[k].length > 0, `${label} ${k}: empty text`);
    assert.equal(out.cmpl_true, out.cmpl_false, `${label}: completions streaming == non-streaming`);
    assert.equal(out.chat_true, out.chat_false, `${label}: chat streaming == non-streaming`);
    const many = await Promise.all(PROMPTS.map((prompt) => post(base, '/v1/completions', { ...base_req, prompt })));
    out.concurrent = many.map((r) => {
      assert.equal(r.status, 200, JSON.stringify(r.body));
      return r.body.choices[0].text;
    });
    const metrics = await (await fetch(base + '/metrics')).text();
    const drafted = Number(/^vllm:spec_decode_num_draft_tokens_total\{[^}]*\} (\S+)/m.exec(metrics)?.[1] ?? 0);
    console.log(`${label}: drafted ${drafted}; completion ${JSON.stringify(out.cmpl_false.slice(0, 60))}`);
    return { out, drafted, log: log() };
  } finally {
    server.kill('SIGTERM');
    await new Promise((res) => server.on('exit', res));
  }
}

const plain = await runAll([], 'plain');
assert.equal(plain.drafted, 0);
const mtp = await runAll(['--speculative-algorithm', 'mtp', '--speculative-num-steps', '3', '--no-speculative-adaptive',
  '--speculative-skip-self-test'], 'mtp');
assert.ok(mtp.drafted > 0, 'the MTP server drafted tokens');
assert.deepEqual(mtp.out, plain.out, 'greedy texts with MTP speculation == without');
console.log('glm_moe_dsa serve (plain and MTP): OK');
