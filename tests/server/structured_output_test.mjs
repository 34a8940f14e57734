// Structured output end to end: `mxserve serve` with the embedded default model (synthetic weights, the
// real 151k-token Qwen3 tokenizer), plain and with MTP speculation. Concurrent requests with different
// schemas (response_format json_schema, vLLM's guided_json / structured_outputs / guided_choice, the
// completions endpoint, streaming); every response must parse and validate under ajv (npm), with
// finish_reason "stop". The model's weights are random, so only schemas whose documents are bounded
// (no free strings) are sure to end within max_tokens; json_object is checked for its start.
// Unsupported keywords and fields must be 400s naming them.
// Usage: node structured_output_test.mjs MXSERVE_BINARY REPO_ROOT
import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert/strict';

import { startTinyServer } from './start_server.mjs';

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
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a' } } } }, 'pattern'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object',
      properties: { n: { type: 'integer', minimum: 0 } } } } } }, 'minimum'],
    [{ guided_json: { type: 'string', format: 'date-time' } }, 'format'],
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
