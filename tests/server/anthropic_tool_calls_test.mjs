// The official Anthropic Node client (unmodified) reading thinking, text and tool_use blocks from
// POST /v1/messages, streamed and not. The server is mxserve_echo_server (echo_server.h): its model writes
// back the last user message, so the test chooses the model output. GLM-4.5 and GLM-5.1 layouts; the
// stream's thinking_delta / text_delta / input_json_delta events rebuild the non-streamed blocks; an agent
// turn sends the blocks back (thinking + tool_use, then tool_result).
// Usage: node anthropic_tool_calls_test.mjs MXSERVE_ECHO_SERVER REPO_ROOT
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert/strict';

const [binary, root] = process.argv.slice(2);
const require = createRequire(path.resolve(root, 'tests/data/package.json'));
let Anthropic;
try {
  Anthropic = require('@anthropic-ai/sdk').default ?? require('@anthropic-ai/sdk');
} catch (e) {
  console.error('missing tests/data/node_modules/@anthropic-ai/sdk: run scripts/setup.sh');
  process.exit(1);
}

async function startServer(template) {
  const proc = spawn(binary, [template, 'sk-echo'], { stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '', err = '';
  proc.stderr.on('data', (d) => { err += d.toString(); });
  const port = await new Promise((resolve, reject) => {
    proc.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on port (\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`echo server exited (${code}):\n${err}`)));
  });
  const client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'sk-echo', maxRetries: 0 });
  return { proc, client };
}

const tools = [
  { name: 'get_weather', description: 'Weather for a city', input_schema: {
    type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } },
  { name: 'get_time', input_schema: { type: 'object', properties: {} } },
];
const withoutIds = (content) => content.map((b) => (b.type === 'tool_use' ? { ...b, id: undefined } : b));

// Raw events, accumulated by hand (as agent frameworks do), checking the sequence.
async function streamed(client, request) {
  const blocks = [], json = [];
  let open = -1, stop = null, sawStart = false, sawStop = false;
  for await (const ev of await client.messages.create({ ...request, stream: true })) {
    if (ev.type === 'message_start') sawStart = true;
    else if (ev.type === 'content_block_start') {
      assert.equal(open, -1, 'one block open at a time');
      assert.equal(ev.index, blocks.length);
      open = ev.index;
      blocks.push({ ...ev.content_block });
    } else if (ev.type === 'content_block_delta') {
      assert.equal(ev.index, open);
      const b = blocks[open];
      if (ev.delta.type === 'text_delta') b.text += ev.delta.text;
      else if (ev.delta.type === 'thinking_delta') b.thinking += ev.delta.thinking;
      else if (ev.delta.type === 'input_json_delta') json[open] = (json[open] ?? '') + ev.delta.partial_json;
      else assert.fail(`unexpected delta ${ev.delta.type}`);
    } else if (ev.type === 'content_block_stop') {
      assert.equal(ev.index, open);
      if (blocks[open].type === 'tool_use') blocks[open].input = JSON.parse(json[open]);
      open = -1;
    } else if (ev.type === 'message_delta') {
      assert.equal(open, -1, 'blocks closed before message_delta');
      stop = ev.delta.stop_reason;
    } else if (ev.type === 'message_stop') sawStop = true;
  }
  assert.ok(sawStart && sawStop);
  return { content: blocks, stop_reason: stop };
}

const servers = [];
try {
  // GLM-4.5 layout: thinking, text and a call.
  const a = await startServer('GLM-4.5-Air');
  servers.push(a);
  const out45 = '<think>Need the weather.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n' +
                '<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>';
  const request = { model: 'echo', max_tokens: 300, tools, messages: [{ role: 'user', content: out45 }] };
  const full = await a.client.messages.create(request);
  assert.equal(full.stop_reason, 'tool_use');
  assert.deepEqual(full.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  assert.equal(full.content[0].thinking, 'Need the weather.');
  assert.equal(full.content[1].text, 'Checking.');
  assert.match(full.content[2].id, /^toolu_[A-Za-z0-9]{24}$/);
  assert.equal(full.content[2].name, 'get_weather');
  assert.deepEqual(full.content[2].input, { city: 'Paris', days: 3 });
  const s = await streamed(a.client, request);
  assert.equal(s.stop_reason, 'tool_use');
  assert.deepEqual(withoutIds(s.content), withoutIds(full.content), 'streamed blocks == non-streamed blocks');
  const final = await a.client.messages.stream(request).finalMessage();
  assert.deepEqual(withoutIds(final.content), withoutIds(full.content), 'the SDK stream helper agrees');

  // The agent's next turn: the assistant blocks and the tool result go back; the answer is text.
  const next = await a.client.messages.create({ model: 'echo', max_tokens: 100, tools, messages: [
    { role: 'user', content: 'weather?' },
    { role: 'assistant', content: full.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: full.content[2].id, content: 'sunny, 21C' },
      { type: 'text', text: '<think>Report it.</think>\nIt is sunny.' }] },
  ] });
  assert.equal(next.stop_reason, 'end_turn');
  assert.deepEqual(next.content, [{ type: 'thinking', thinking: 'Report it.', signature: '' },
    { type: 'text', text: 'It is sunny.' }]);

  // tool_choice none: the call text stays text (reasoning is still split).
  const none = await a.client.messages.create({ ...request, tool_choice: { type: 'none' } });
  assert.equal(none.stop_reason, 'end_turn');
  assert.deepEqual(none.content.map((b) => b.type), ['thinking', 'text']);
  assert.match(none.content[1].text, /<tool_call>get_weather/);

  // GLM-5.1 layout: the prompt opens <think>, two calls, no text.
  const b = await startServer('GLM-5.1');
  servers.push(b);
  const out51 = '<think>Both.</think><tool_call>get_time</tool_call><tool_call>get_weather<arg_key>city</arg_key>' +
                '<arg_value>Oslo</arg_value></tool_call>';
  const req51 = { model: 'echo', max_tokens: 300, tools, messages: [{ role: 'user', content: out51 }] };
  const full51 = await b.client.messages.create(req51);
  assert.deepEqual(full51.content.map((x) => x.type), ['thinking', 'tool_use', 'tool_use']);
  assert.deepEqual(full51.content[1].input, {});
  assert.deepEqual(full51.content[2].input, { city: 'Oslo' });
  assert.notEqual(full51.content[1].id, full51.content[2].id);
  const s51 = await streamed(b.client, req51);
  assert.deepEqual(withoutIds(s51.content), withoutIds(full51.content));
  assert.equal(s51.stop_reason, 'tool_use');
  // Thinking disabled (enable_thinking false: the GLM-5.1 prompt closes the think block): the turn is text.
  const noThink = await b.client.messages.create({ model: 'echo', max_tokens: 100, thinking: { type: 'disabled' },
    messages: [{ role: 'user', content: '</think>Just an answer.' }] });
  assert.deepEqual(noThink.content, [{ type: 'text', text: 'Just an answer.' }]);
  const think = await b.client.messages.create({ model: 'echo', max_tokens: 100, thinking: { type: 'enabled',
    budget_tokens: 1024 }, messages: [{ role: 'user', content: '<think>Hmm.</think>Answer.' }] });
  assert.deepEqual(think.content, [{ type: 'thinking', thinking: 'Hmm.', signature: '' }, { type: 'text', text: 'Answer.' }]);
  console.log('anthropic client: thinking / text / tool_use blocks, streamed == non-streamed, agent turn, ' +
    'tool_choice none, thinking disabled, GLM-4.5 and GLM-5.1 layouts all OK');
} finally {
  for (const s of servers) s.proc.stdin.end();
}
