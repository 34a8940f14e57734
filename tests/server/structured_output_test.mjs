// Structured output end to end: `mxserve serve` with the embedded default model (synthetic weights, the
// real 151k-token Qwen3 tokenizer), plain and with MTP speculation. Concurrent requests with different
// schemas (response_format json_schema, vLLM's guided_json / structured_outputs / guided_choice, the
// completions endpoint, streaming); every response must parse and validate under ajv (npm), with
// finish_reason "stop". The model's weights are random, so only schemas whose documents are bounded
// (no free strings) are sure to end within max_tokens; json_object is checked for its start.
// Unsupported keywords and fields must be 400s naming them. The value keywords (bounds, lengths, pattern,
// format) go through the official client's .parse() with a zod schema on the embedded trained model.
// Usage: node structured_output_test.mjs MXSERVE_BINARY REPO_ROOT
import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert/strict';

import { startTinyServer, startTrainedServer } from './start_server.mjs';

const [binary, root] = process.argv.slice(2);
const require = createRequire(path.join(root, 'tests/data/package.json'));
const Ajv = require('ajv').default ?? require('ajv');
const ajv = new Ajv({ strict: false });

const startServer = (extra) => startTinyServer(binary, root, extra);

const post = async (base, route, body) => {
  const r = await fetch(base + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
};
const messages = [{ role: 'user', content: 'Give me a record as JSON.' }];

const schemas = {
  record: { type: 'object', additionalProperties: false, required: ['id', 'ok', 'level'],
    properties: { id: { type: 'integer' }, ok: { type: 'boolean' }, level: { enum: ['low', 'mid', 'high'] },
      kind: { const: 'fixed' }, ratio: { type: 'number' } } },
  list: { type: 'array', items: { type: 'integer' }, minItems: 1, maxItems: 3 },
  nested: { type: 'object', additionalProperties: false, required: ['a', 'b'], properties: {
    a: { type: 'object', additionalProperties: false, required: ['x'], properties: { x: { type: ['integer', 'null'] } } },
    b: { type: 'array', maxItems: 2, items: { anyOf: [{ type: 'boolean' }, { enum: ['yes', 'no'] }] } } } },
  refs: { $defs: { p: { type: 'object', additionalProperties: false, required: ['v'], properties: { v: { type: 'number' } } } },
    type: 'object', additionalProperties: false, required: ['first', 'second'],
    properties: { first: { $ref: '#/$defs/p' }, second: { $ref: '#/$defs/p' } } },
};

async function checkValid(name, schema, text, finish) {
  assert.equal(finish, 'stop', `${name}: finish_reason ${finish} for ${JSON.stringify(text)}`);
  let v;
  try { v = JSON.parse(text); } catch (e) { assert.fail(`${name}: not JSON: ${JSON.stringify(text)}`); }
  const validate = ajv.compile(schema);
  assert.ok(validate(v), `${name}: ${JSON.stringify(text)} fails the schema: ${ajv.errorsText(validate.errors)}`);
}

// full = false (the MTP server): one request per schema, to keep the CPU suite short.
async function batchOfSchemas(base, label, full) {
  const jobs = [];
  let i = 0;
  for (const [name, schema] of Object.entries(schemas)) {
    const temperature = i++ % 2 ? 1.0 : 0;
    jobs.push(post(base, '/v1/chat/completions', { messages, max_tokens: 400, temperature, seed: 3,
      response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } } })
      .then((r) => ({ name, schema, r })));
    if (full)
      jobs.push(post(base, '/v1/chat/completions', { messages, max_tokens: 400, temperature: 1.0, seed: 11, guided_json: schema })
        .then((r) => ({ name: name + '/guided_json', schema, r })));
  }
  if (!full) {
    const done = await Promise.all(jobs);
    for (const { name, schema, r } of done) {
      assert.equal(r.status, 200, `${label} ${name}: ${JSON.stringify(r.body)}`);
      for (const c of r.body.choices) await checkValid(`${label} ${name}`, schema, c.message.content, c.finish_reason);
    }
    console.log(`${label}: ${done.length} concurrent structured requests validated`);
    return;
  }
  jobs.push(post(base, '/v1/chat/completions', { messages, max_tokens: 400, structured_outputs: { json: schemas.list } })
    .then((r) => ({ name: 'structured_outputs.json', schema: schemas.list, r })));
  jobs.push(post(base, '/v1/chat/completions', { messages, max_tokens: 400, n: 3, temperature: 1.0,
    response_format: { type: 'json_schema', json_schema: { name: 'n3', schema: schemas.record } } })
    .then((r) => ({ name: 'n=3', schema: schemas.record, r })));
  const done = await Promise.all(jobs);
  for (const { name, schema, r } of done) {
    assert.equal(r.status, 200, `${label} ${name}: ${JSON.stringify(r.body)}`);
    for (const c of r.body.choices) await checkValid(`${label} ${name}`, schema, c.message.content, c.finish_reason);
  }
  // guided_choice, chat and completions
  const choices = ['alpha', 'beta', 'gamma delta'];
  const ch = await post(base, '/v1/chat/completions', { messages, max_tokens: 50, temperature: 1.0, seed: 5, guided_choice: choices });
  assert.equal(ch.status, 200, JSON.stringify(ch.body));
  assert.ok(choices.includes(ch.body.choices[0].message.content), JSON.stringify(ch.body.choices[0]));
  const co = await post(base, '/v1/completions', { prompt: 'Pick one:', max_tokens: 50, structured_outputs: { choice: choices } });
  assert.equal(co.status, 200, JSON.stringify(co.body));
  assert.ok(choices.includes(co.body.choices[0].text), JSON.stringify(co.body.choices[0]));
  // json_object: random weights need not finish; the output starts an object
  const jo = await post(base, '/v1/chat/completions', { messages, max_tokens: 8, response_format: { type: 'json_object' } });
  assert.equal(jo.status, 200);
  assert.match(jo.body.choices[0].message.content, /^\s?\{/);
  const metrics = await (await fetch(base + '/metrics')).text();
  const masks = Number((metrics.match(/^mxserve:grammar_masks_total\{[^}]*\} (\S+)/m) || [])[1]);
  assert.ok(masks > 0, 'mxserve:grammar_masks_total counts the masks');
  console.log(`${label}: ${done.length} concurrent structured requests validated; choice + json_object ok; ${masks} masks`);
}

async function streamed(base) {
  const r = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: 400, stream: true, temperature: 1.0, seed: 9,
      response_format: { type: 'json_schema', json_schema: { name: 'nested', schema: schemas.nested } } }) });
  assert.equal(r.status, 200);
  const body = await r.text();
  let text = '', finish = null;
  for (const line of body.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const chunk = JSON.parse(line.slice(6));
    const c = chunk.choices[0];
    if (c.delta && c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  await checkValid('stream', schemas.nested, text, finish);
  console.log('streaming: assembled deltas validate');
}

async function badRequests(base) {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^(a)\\1$' } } } }, 'backreference'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '(?=a)' } } } }, 'lookaround'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object',
      properties: { n: { type: 'array', uniqueItems: true } } } } } }, 'uniqueItems'],
    [{ guided_json: { type: 'integer', minimum: 5, maximum: 4 } }, 'minimum'],
    [{ guided_json: { type: 'string', format: 'uri' } }, 'format'],
    [{ guided_regex: '[a-z]+' }, 'guided_regex'],
    [{ guided_grammar: 'root ::= "a"' }, 'guided_grammar'],
    [{ structured_outputs: { regex: 'a+' } }, 'structured_outputs.regex'],
    [{ response_format: { type: 'yaml' } }, 'response_format'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 'response_format.json_schema.schema'],
    [{ guided_choice: [] }, 'guided_choice'],
    [{ guided_json: { type: 'integer' }, guided_choice: ['a'] }, 'guided_choice'],
    [{ guided_json: { type: 'integer' }, ignore_eos: true }, 'ignore_eos'],
  ];
  for (const [extra, name] of cases) {
    const r = await post(base, '/v1/chat/completions', { messages, max_tokens: 5, ...extra });
    assert.equal(r.status, 400, `${JSON.stringify(extra)} -> ${r.status} ${JSON.stringify(r.body)}`);
    const text = JSON.stringify(r.body.error);
    assert.ok(text.includes(name), `${JSON.stringify(extra)}: the error does not name '${name}': ${text}`);
  }
  console.log(`${cases.length} bad structured-output requests rejected with 400 naming the culprit`);
}

// Issue 35: the value keywords typed clients emit (minimum / maximum / exclusive*, multipleOf, minLength /
// maxLength, pattern, format, minItems / maxItems), through the official client's .parse() with a zod schema
// (openai/helpers/zod), on the embedded trained model: every parsed object passes zod, greedy and sampled,
// MTP off and on (greedy: the same object).
async function zodParse(label, extra) {
  const OpenAI = require('openai').default ?? require('openai');
  const { z } = require('zod');
  const { zodResponseFormat } = require('openai/helpers/zod');
  const Person = z.object({
    name: z.string().min(1).max(12),
    age: z.number().int().min(0).max(120),
    code: z.string().regex(/^[A-Z]{2}-\d{3}$/),
    score: z.number().min(0).max(1),
    lucky: z.number().int().multipleOf(7).gt(0).lt(100),
    tags: z.array(z.string().max(8)).min(1).max(3),
    born: z.string().date(),
    id: z.string().uuid(),
  });
  const { server, base, log } = await startTrainedServer(binary, root, extra);
  try {
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const ask = (temperature, seed) => client.chat.completions.parse({
      model: 'tiny', messages: [{ role: 'user', content: 'Describe a person as JSON.' }], max_tokens: 400, temperature, seed,
      response_format: zodResponseFormat(Person, 'person') });
    const done = await Promise.all([ask(0, 1), ask(1.0, 2), ask(1.0, 3), ask(1.0, 4)]);
    for (const c of done) {
      const choice = c.choices[0];
      assert.equal(choice.finish_reason, 'stop', JSON.stringify(choice.message));
      assert.ok(choice.message.parsed, JSON.stringify(choice.message));
      const check = Person.safeParse(choice.message.parsed);
      assert.ok(check.success, `${choice.message.content}: ${JSON.stringify(check.error?.issues)}`);
    }
    console.log(`${label}: zod .parse() x${done.length} on the trained model: ${done[0].choices[0].message.content}`);
    return done[0].choices[0].message.content;
  } catch (e) {
    console.error(log().split('\n').slice(-30).join('\n'));
    throw e;
  } finally {
    server.kill('SIGTERM');
  }
}

const greedyPlain = await zodParse('plain', []);
const greedyMtp = await zodParse('mtp', ['--speculative-algorithm', 'mtp', '--speculative-num-steps', '2']);
assert.equal(greedyMtp, greedyPlain, 'MTP speculation changes no greedy structured output');

for (const [label, extra] of [['plain', []], ['mtp', ['--speculative-algorithm', 'mtp', '--speculative-num-steps', '2']]]) {
  const { server, base, log } = await startServer(extra);
  try {
    await batchOfSchemas(base, label, label === 'plain');
    if (label === 'plain') {
      await streamed(base);
      await badRequests(base);
    }
  } catch (e) {
    console.error(log().split('\n').slice(-30).join('\n'));
    throw e;
  } finally {
    server.kill('SIGTERM');
  }
}
console.log('structured output: all checks passed');
