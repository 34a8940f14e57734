// End-to-end check with the official OpenAI Node client (unmodified) against `mxserve serve` running
// the embedded default (models/tiny-glm4-moe, synthetic weights, the real Qwen3 tokenizer and chat
// template) -- the README's first command. Usage: node openai_client_test.mjs MXSERVE_BINARY REPO_ROOT
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

const { server, base, log } = await startTinyServer(binary, root, ['--api-key', 'sk-test'], { loading503: true });

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-test', maxRetries: 0 });
try {
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'tiny-glm');

  const chat = await client.chat.completions.create({
    model: 'tiny-glm', messages: [{ role: 'user', content: 'Hello, who are you?' }], max_tokens: 6, ignore_eos: true,
  });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(typeof chat.choices[0].message.content, 'string');
  assert.equal(chat.choices[0].finish_reason, 'length');
  assert.equal(chat.usage.completion_tokens, 6);
  assert.ok(chat.usage.prompt_tokens > 5);
  assert.equal(typeof chat.usage.prompt_tokens_details.cached_tokens, 'number');

  const stream = await client.chat.completions.create({
    model: 'tiny-glm', messages: [{ role: 'user', content: 'Hello, who are you?' }], max_tokens: 5, ignore_eos: true,
    temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null, finish = null, first = true;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    if (first) assert.equal(chunk.choices[0].delta.role, 'assistant');
    first = false;
    text += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 5);
  const again = await client.chat.completions.create({
    model: 'tiny-glm', messages: [{ role: 'user', content: 'Hello, who are you?' }], max_tokens: 5, ignore_eos: true,
    temperature: 0,
  });
  assert.equal(again.choices[0].message.content, text, 'greedy streaming == greedy non-streaming');

  const cmpl = await client.completions.create({ model: 'tiny-glm', prompt: ['The capital of France is', 'Hi'], max_tokens: 3 });
  assert.equal(cmpl.choices.length, 2);

  await assert.rejects(
    client.chat.completions.create({ model: 'tiny-glm', messages: [{ role: 'user', content: 'x' }], temperature: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  await assert.rejects(
    client.chat.completions.create({ model: 'tiny-glm', messages: [{ role: 'user', content: 'x' }], max_tokens: 5000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' &&
      /maximum context length is 2048 tokens/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError);
  const wrongKey = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  console.log('openai client: models, chat, streaming chat, completions and error classes all OK');
} finally {
  server.kill('SIGTERM');
}
const code = await new Promise((res) => server.on('exit', (c) => res(c)));
assert.equal(code, 0, 'graceful shutdown exits 0:\n' + log());
