// End-to-end check of POST /v1/messages with the official Anthropic Node client (@anthropic-ai/sdk,
// unmodified) against `mxserve serve` running the tiny trained GLM (models/tiny-glm-trained: the GLM-4.5
// chat template, tool-call and reasoning parsers) on the CPU. Greedy requests are compared with the same
// conversation sent to /v1/chat/completions: equal prompt token counts show the translation renders the
// same prompt, equal text that both routes share one engine and parser.
// Usage: node anthropic_client_test.mjs MXSERVE_BINARY REPO_ROOT
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert/strict';

const [binary, root] = process.argv.slice(2);
const require = createRequire(path.join(root, 'tests/data/package.json'));
let Anthropic;
try {
  Anthropic = require('@anthropic-ai/sdk').default ?? require('@anthropic-ai/sdk');
} catch (e) {
  console.error('missing tests/data/node_modules/@anthropic-ai/sdk: run scripts/setup.sh');
  process.exit(1);
}

const KEY = 'sk-ant-test';
const N = 12;  // max_tokens of the text requests (a busy 2-core CPU: keep them short)
const server = spawn(binary, [
  'serve', '--model', path.join(root, 'models/tiny-glm-trained'), '--port', '0', '--served-model-name', 'tiny-glm',
  '--kv-cache-memory', '256MiB', '--max-model-len', '2048', '--stats-interval', '0', '--api-key', KEY,
], { stdio: ['ignore', 'ignore', 'pipe'] });
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
for (const deadline = Date.now() + 240000; ;) {
  const r = await fetch(`${base}/health`).catch(() => null);
  if (r && r.status === 200) break;
  if (Date.now() > deadline) throw new Error('mxserve never became healthy:\n' + log);
  await new Promise((res) => setTimeout(res, 200));
}

// The same conversation through the OpenAI route (plain fetch).
async function openaiChat(body) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'tiny-glm', temperature: 0, ...body }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}
const promptTokens = (u) => u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
const textOf = (msg) => msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

const client = new Anthropic({ baseURL: base, apiKey: KEY, maxRetries: 0 });
const weatherTool = {
  name: 'get_weather', description: 'Weather for a city',
  input_schema: { type: 'object', properties: { unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
    hourly: { type: 'boolean' } }, required: ['unit', 'hourly'] },
};
// A one-argument tool for the forced calls (the grammar spells the call out nearly a character per token on this
// small vocabulary: fewer arguments, fewer tokens on a busy CPU).
const unitTool = {
  name: 'set_unit', description: 'Choose the temperature unit',
  input_schema: { type: 'object', properties: { unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['unit'] },
};
try {
  // 1. Plain text, greedy: the message shape, and the OpenAI route's answer to the same request.
  const ask = [{ role: 'user', content: 'Tell me about the city.' }];
  const plain = await client.messages.create({ model: 'tiny-glm', max_tokens: N, temperature: 0, messages: ask,
    metadata: { user_id: 'u1' } });
  assert.match(plain.id, /^msg_[A-Za-z0-9]{24}$/);
  assert.equal(plain.type, 'message');
  assert.equal(plain.role, 'assistant');
  assert.equal(plain.model, 'tiny-glm');
  assert.ok(['max_tokens', 'end_turn'].includes(plain.stop_reason), plain.stop_reason);
  assert.equal(plain.stop_sequence, null);
  assert.ok(plain.usage.output_tokens >= 1 && plain.usage.output_tokens <= N);
  const text = textOf(plain);
  assert.ok(text.length > 0, 'greedy text is not empty');
  const oa = await openaiChat({ messages: ask, max_tokens: N });
  assert.equal(promptTokens(plain.usage), oa.usage.prompt_tokens, 'same rendered prompt as /v1/chat/completions');
  assert.equal(text, oa.choices[0].message.content ?? '', 'same greedy text as /v1/chat/completions');
  assert.equal(plain.stop_reason === 'max_tokens', oa.choices[0].finish_reason === 'length');

  // 2. Streaming: the exact event sequence, and the streamed text equals the non-streamed one.
  const events = [];
  for await (const ev of await client.messages.create({ model: 'tiny-glm', max_tokens: N, temperature: 0,
    messages: ask, stream: true })) events.push(ev);
  const types = events.map((e) => e.type);
  assert.equal(types[0], 'message_start');
  assert.deepEqual(events[0].message.content, []);
  assert.equal(events[0].message.stop_reason, null);
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  const blocks = types.slice(1, -2).join(' ');
  assert.match(blocks, /^(content_block_start( content_block_delta)+ content_block_stop ?)+$/, blocks);
  let streamed = '';
  for (const e of events) {
    if (e.type === 'content_block_start') assert.equal(e.index, events.filter((x) => x.type === 'content_block_start').indexOf(e));
    if (e.type === 'content_block_delta' && e.delta.type === 'text_delta') streamed += e.delta.text;
  }
  assert.equal(streamed, text, 'streamed text == non-streamed text at temperature 0');
  const md = events.at(-2);
  assert.equal(md.delta.stop_reason, plain.stop_reason);
  assert.equal(md.usage.output_tokens, plain.usage.output_tokens);
  // The SDK's stream helper accumulates the same message.
  const final = await client.messages.stream({ model: 'tiny-glm', max_tokens: N, temperature: 0, messages: ask })
    .finalMessage();
  assert.deepEqual(final.content, plain.content);
  assert.equal(final.stop_reason, plain.stop_reason);

  // 3. System prompt: a string and a list of text blocks render the same prompt as an OpenAI system message.
  const sysA = await client.messages.create({ model: 'tiny-glm', max_tokens: 8, temperature: 0, messages: ask,
    system: 'You are a helpful guide.' });
  const sysB = await client.messages.create({ model: 'tiny-glm', max_tokens: 8, temperature: 0, messages: ask,
    system: [{ type: 'text', text: 'You are a helpful guide.' }] });
  const sysO = await openaiChat({ max_tokens: 8, messages: [{ role: 'system', content: 'You are a helpful guide.' }, ...ask] });
  assert.equal(promptTokens(sysA.usage), sysO.usage.prompt_tokens);
  assert.equal(promptTokens(sysB.usage), sysO.usage.prompt_tokens);
  assert.ok(promptTokens(sysA.usage) > promptTokens(plain.usage), 'the system prompt is in the prompt');
  assert.equal(textOf(sysA), textOf(sysB));
  assert.equal(textOf(sysA), sysO.choices[0].message.content ?? '');

  // 4. Multi-turn with tool_use + tool_result (and a thinking block): the prompt equals the OpenAI rendering of
  //    assistant tool_calls + a tool message.
  const turns = [
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: [
      { type: 'thinking', thinking: 'I should call the tool.', signature: 'sig' },
      { type: 'text', text: 'Let me check.' },
      { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { unit: 'celsius', hourly: false } }] },
    { role: 'user', content: [
      { type: 'tool_result', tool_use_id: 'toolu_01', content: [{ type: 'text', text: 'sunny, 21 C' }] },
      { type: 'text', text: 'Thanks, and tomorrow?' }] },
  ];
  const multi = await client.messages.create({ model: 'tiny-glm', max_tokens: 12, temperature: 0, tools: [weatherTool],
    messages: turns });
  const multiO = await openaiChat({ max_tokens: 12, tools: [{ type: 'function', function: {
    name: weatherTool.name, description: weatherTool.description, parameters: weatherTool.input_schema } }],
  messages: [
    turns[0],
    { role: 'assistant', content: 'Let me check.', reasoning_content: 'I should call the tool.', tool_calls: [
      { id: 'toolu_01', type: 'function', function: { name: 'get_weather', arguments: '{"unit":"celsius","hourly":false}' } }] },
    { role: 'tool', tool_call_id: 'toolu_01', content: 'sunny, 21 C' },
    { role: 'user', content: 'Thanks, and tomorrow?' },
  ] });
  assert.equal(promptTokens(multi.usage), multiO.usage.prompt_tokens, 'tool_use / tool_result render as in OpenAI');
  assert.equal(textOf(multi), multiO.choices[0].message.content ?? '');
  const toolsOnly = await client.messages.countTokens({ model: 'tiny-glm', tools: [weatherTool], messages: turns });
  assert.equal(toolsOnly.input_tokens, promptTokens(multi.usage), 'count_tokens counts the same prompt');

  // 5. A forced tool (tool_choice tool): a tool_use block whose input parses against the schema, streamed or not.
  const forcedReq = { model: 'tiny-glm', max_tokens: 120, temperature: 0, tools: [unitTool],
    tool_choice: { type: 'tool', name: 'set_unit' }, messages: [{ role: 'user', content: 'Weather in Paris?' }] };
  const forced = await client.messages.create(forcedReq);
  assert.equal(forced.stop_reason, 'tool_use', JSON.stringify(forced));
  const use = forced.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(forced.content));
  assert.match(use.id, /^toolu_/);
  assert.equal(use.name, 'set_unit');
  assert.deepEqual(Object.keys(use.input), ['unit']);
  assert.ok(['celsius', 'fahrenheit'].includes(use.input.unit), JSON.stringify(use.input));
  const fstream = client.messages.stream(forcedReq);
  let jsonSeen = '';
  fstream.on('inputJson', (delta) => { jsonSeen += delta; });
  const ffinal = await fstream.finalMessage();
  assert.equal(ffinal.stop_reason, 'tool_use');
  const fuse = ffinal.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(fuse.input, use.input, 'streamed tool input == non-streamed');
  assert.deepEqual(JSON.parse(jsonSeen), use.input, 'input_json_delta carries the input');

  // 6. stop_sequences: a string of the greedy text stops it there, reported as stop_sequence.
  let k = Math.max(1, Math.floor(text.length / 2));
  let seq = text.slice(k, k + 3);
  while (text.indexOf(seq) !== k && k < text.length - 3) seq = text.slice(++k, k + 3);
  assert.equal(text.indexOf(seq), k, `a stop sequence first found at ${k} of ${JSON.stringify(text)}`);
  const stopped = await client.messages.create({ model: 'tiny-glm', max_tokens: N, temperature: 0, messages: ask,
    stop_sequences: [seq] });
  assert.equal(stopped.stop_reason, 'stop_sequence');
  assert.equal(stopped.stop_sequence, seq);
  assert.ok(text.startsWith(textOf(stopped)) && !textOf(stopped).includes(seq), JSON.stringify(stopped.content));
  const stoppedStream = await client.messages.stream({ model: 'tiny-glm', max_tokens: N, temperature: 0, messages: ask,
    stop_sequences: [seq] }).finalMessage();
  assert.equal(stoppedStream.stop_reason, 'stop_sequence');
  assert.equal(stoppedStream.stop_sequence, seq);
  assert.equal(textOf(stoppedStream), textOf(stopped));

  // 7. max_tokens stop.
  const short = await client.messages.create({ model: 'tiny-glm', max_tokens: 3, temperature: 0, messages: ask });
  assert.equal(short.stop_reason, 'max_tokens');
  assert.equal(short.usage.output_tokens, 3);

  // 8. Errors through the SDK's error classes, in Anthropic's shape.
  const isInvalid = (e) => e instanceof Anthropic.BadRequestError && e.status === 400 &&
    e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error';
  await assert.rejects(client.messages.create({ model: 'tiny-glm', messages: ask }),
    (e) => isInvalid(e) && /max_tokens/.test(e.message));
  await assert.rejects(client.messages.create({ model: 'tiny-glm', max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }),
    (e) => isInvalid(e) && /messages\[0\]\.role/.test(e.message));
  await assert.rejects(client.messages.create({ model: 'tiny-glm', max_tokens: 4, messages: ask,
    tool_choice: { type: 'tool', name: 'nope' }, tools: [weatherTool] }),
  (e) => isInvalid(e) && /tool_choice\.name/.test(e.message));
  await assert.rejects(client.messages.create({ model: 'tiny-glm', max_tokens: 5000, messages: ask }),
    (e) => isInvalid(e) && /maximum context length is 2048/.test(e.message));
  await assert.rejects(client.messages.create({ model: 'claude-x', max_tokens: 4, messages: ask }),
    (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === 'not_found_error');
  const wrongKey = new Anthropic({ baseURL: base, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create({ model: 'tiny-glm', max_tokens: 4, messages: ask }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error?.error?.type === 'authentication_error');
  const bearer = new Anthropic({ baseURL: base, apiKey: null, authToken: KEY, maxRetries: 0 });
  const viaBearer = await bearer.messages.create({ model: 'tiny-glm', max_tokens: 2, temperature: 0, messages: ask });
  assert.equal(viaBearer.stop_reason, 'max_tokens', 'Authorization: Bearer is accepted too');
  console.log('anthropic client: text, system, tool_use/tool_result, forced tool, stop_sequences, max_tokens, ' +
    'streaming events, count_tokens and error classes all OK');
} finally {
  server.kill('SIGTERM');
}
const code = await new Promise((res) => server.on('exit', (c) => res(c)));
assert.equal(code, 0, 'graceful shutdown exits 0:\n' + log);
