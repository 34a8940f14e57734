// The official OpenAI Node client (unmodified) on the surface lm-eval-harness and vLLM users need, against
// `mxserve serve` (the embedded tiny model, real Qwen3 tokenizer): a multiple-choice item scored the way
// lm-eval's local-completions model does it (prompt = context + continuation token ids, echo, logprobs 1,
// max_tokens 1; the continuation's logprobs are token_logprobs[ctxlen:-1]); the developer role; models.retrieve
// (and its 404); /version; /tokenize and /detokenize (vLLM's shapes); CORS with --allowed-origins.
// Usage: node openai_surface_test.mjs MXSERVE_BINARY REPO_ROOT   (MXSERVE_BACKEND=cuda: the same on the GPU, where
// batched and single-prompt scores agree to bf16 noise instead of 1e-4)
import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert/strict';

import { startTinyServer } from './start_server.mjs';

const [binary, root] = process.argv.slice(2);
const require = createRequire(path.join(root, 'tests/data/package.json'));
let OpenAI;
try {
  OpenAI = require('openai').default ?? require('openai');
} catch (e) {
  console.error('missing tests/data/node_modules/openai: run scripts/setup.sh');
  process.exit(1);
}

const origin = 'http://localhost:5173';
const backend = process.env.MXSERVE_BACKEND ?? 'cpu';
const tol = backend === 'cpu' ? 1e-4 : 5e-2;
const { server, base, log } = await startTinyServer(binary, root,
  ['--api-key', 'sk-test', '--allowed-origins', origin, '--backend', backend]);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-test', maxRetries: 0 });
const post = async (p, body) => {
  const r = await fetch(`${base}${p}`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  return { status: r.status, json: await r.json() };
};

try {
  // --- lm-eval-harness loglikelihood / multiple choice ---
  const tok = async (text) => (await post('/tokenize', { model: 'tiny-glm', prompt: text, add_special_tokens: false })).json.tokens;
  const context = await tok('Question: What color is the sky on a clear day?\nAnswer:');
  const options = [' blue', ' green', ' a loud noise', ' seven'];
  const prompts = [];
  for (const o of options) prompts.push([...context, ...(await tok(o))]);
  const res = await client.completions.create({
    model: 'tiny-glm', prompt: prompts, echo: true, logprobs: 1, max_tokens: 1, temperature: 0, seed: 1234,
  });
  assert.equal(res.choices.length, options.length);
  const scores = [];
  for (let k = 0; k < options.length; ++k) {
    const lp = res.choices[k].logprobs;
    assert.equal(lp.token_logprobs.length, prompts[k].length + 1, 'every prompt token and the generated one');
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.tokens.length, lp.token_logprobs.length);
    // lm-eval's parse_logprobs, verbatim in meaning
    const cont = lp.token_logprobs.slice(context.length, -1);
    const tops = lp.top_logprobs.slice(context.length, -1);
    assert.equal(cont.length, prompts[k].length - context.length);
    let isGreedy = true;
    for (let i = 0; i < cont.length; ++i) {
      assert.ok(Number.isFinite(cont[i]) && cont[i] <= 0);
      if (cont[i] !== Math.max(...Object.values(tops[i]))) isGreedy = false;
    }
    scores.push({ ll: cont.reduce((a, b) => a + b, 0), isGreedy });
  }
  // The same scores with max_tokens 0 (OpenAI's scoring shape) and with vLLM's prompt_logprobs.
  const zero = await client.completions.create({ model: 'tiny-glm', prompt: prompts[0], echo: true, logprobs: 1, max_tokens: 0 });
  assert.equal(zero.choices[0].logprobs.token_logprobs.length, prompts[0].length);
  assert.equal(zero.usage.completion_tokens, 0);
  const zl = zero.choices[0].logprobs.token_logprobs.slice(context.length).reduce((a, b) => a + b, 0);
  assert.ok(Math.abs(zl - scores[0].ll) < tol, `max_tokens 0 gives the same loglikelihood (${zl} vs ${scores[0].ll})`);
  const pl = await client.completions.create({ model: 'tiny-glm', prompt: prompts[0], max_tokens: 1, prompt_logprobs: 0 });
  const plist = pl.choices[0].prompt_logprobs;
  assert.equal(plist.length, prompts[0].length);
  assert.equal(plist[0], null);
  let pll = 0;
  for (let i = context.length; i < prompts[0].length; ++i) pll += plist[i][String(prompts[0][i])].logprob;
  assert.ok(Math.abs(pll - scores[0].ll) < tol, 'prompt_logprobs agree with echo logprobs');
  console.log('multiple choice scores', JSON.stringify(scores));

  // --- developer role: a system turn for a template without one ---
  const usage = async (messages) =>
    (await client.chat.completions.create({ model: 'tiny-glm', messages, max_tokens: 1 })).usage.prompt_tokens;
  const user = { role: 'user', content: 'Hello' };
  const withDev = await usage([{ role: 'developer', content: 'Answer in French.' }, user]);
  const withSys = await usage([{ role: 'system', content: 'Answer in French.' }, user]);
  const bare = await usage([user]);
  assert.ok(withDev > bare, 'the developer message is not dropped');
  assert.equal(withDev, withSys);

  // --- models.retrieve, its 404, /version ---
  const m = await client.models.retrieve('tiny-glm');
  assert.equal(m.id, 'tiny-glm');
  await assert.rejects(client.models.retrieve('nope'), (e) => e.status === 404 && e.code === 'model_not_found');
  const v = await (await fetch(`${base}/version`)).json();
  assert.equal(typeof v.version, 'string');

  // --- /tokenize and /detokenize (vLLM shapes) ---
  const t = await post('/tokenize', { model: 'tiny-glm', messages: [user] });
  assert.equal(t.status, 200);
  assert.equal(t.json.count, bare);
  assert.equal(t.json.max_model_len, 2048);
  const d = await post('/detokenize', { model: 'tiny-glm', tokens: await tok('round trip') });
  assert.deepEqual(d, { status: 200, json: { prompt: 'round trip' } });

  // --- CORS ---
  const pre = await fetch(`${base}/v1/chat/completions`, { method: 'OPTIONS', headers: {
    Origin: origin, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization,content-type' } });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get('access-control-allow-origin'), origin);
  const other = await fetch(`${base}/v1/models`, { headers: { Origin: 'http://elsewhere.example', Authorization: 'Bearer sk-test' } });
  assert.equal(other.status, 200);
  assert.equal(other.headers.get('access-control-allow-origin'), null);
  const same = await fetch(`${base}/v1/models`, { headers: { Origin: origin, Authorization: 'Bearer sk-test' } });
  assert.equal(same.headers.get('access-control-allow-origin'), origin);
  console.log('openai surface: OK');
} catch (e) {
  console.error(e);
  console.error(log());
  process.exitCode = 1;
} finally {
  server.kill('SIGTERM');
}
