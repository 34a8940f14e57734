// The grammar against an independent JSON-schema validator (ajv, npm). For each schema:
//  (a) documents produced by constrained random decoding (structured_oracle generate) must parse and
//      validate;
//  (b) candidate texts -- random valid documents, value-level mutations (wrong type, missing / extra key,
//      out-of-enum) and byte-level mutations -- are classified by the grammar (structured_oracle check):
//      accepted => valid always; for canonical texts (compact JSON, keys in schema order) of "exact"
//      schemas also valid => accepted.
// Usage: node grammar_oracle.mjs STRUCTURED_ORACLE_BINARY REPO_ROOT
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const [binary, root] = process.argv.slice(2);
const require = createRequire(path.join(root, 'tests/data/package.json'));
let Ajv;
try {
  Ajv = require('ajv').default ?? require('ajv');
} catch (e) {
  console.error('missing tests/data/node_modules/ajv: run scripts/setup.sh');
  process.exit(1);
}
const ajv = new Ajv({ strict: false });

let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const pick = (a) => a[Math.floor(rand() * a.length)];
const STRINGS = ['', 'a', 'hello world', 'é€😀', 'quote " and \\ backslash', 'line\nbreak', 'ctl\u0001', 'tab\t', 'red'];

function resolve(schema, rootSchema) {
  if (schema && schema.$ref) return rootSchema.$defs[schema.$ref.split('/').pop()];
  return schema;
}
function gen(schema, rootSchema, depth = 0) {
  schema = resolve(schema, rootSchema);
  if (schema === true || Object.keys(schema).filter((k) => k !== '$defs').length === 0) return randomValue(depth);
  if (schema.const !== undefined) return schema.const;
  if (schema.enum) return pick(schema.enum);
  if (schema.anyOf || schema.oneOf) return gen(pick(schema.anyOf || schema.oneOf), rootSchema, depth);
  const type = Array.isArray(schema.type) ? pick(schema.type) : schema.type;
  switch (type) {
    case 'string': return pick(STRINGS);
    case 'integer': return Math.floor(rand() * 2000) - 1000;
    case 'number': return pick([0, -1, 3.25, 1e21, -0.5, Math.round(rand() * 1e5) / 100]);
    case 'boolean': return rand() < 0.5;
    case 'null': return null;
    case 'array': {
      const lo = schema.minItems ?? 0, hi = Math.min(schema.maxItems ?? 3, lo + 3);
      const n = lo + Math.floor(rand() * (hi - lo + 1));
      return Array.from({ length: depth > 3 ? lo : n }, () => gen(schema.items ?? {}, rootSchema, depth + 1));
    }
    case 'object': {
      const out = {};
      const req = new Set(schema.required ?? []);
      for (const [k, v] of Object.entries(schema.properties ?? {}))
        if (req.has(k) || (depth < 3 && rand() < 0.5)) out[k] = gen(v, rootSchema, depth + 1);
      if (!schema.properties && depth < 3) for (let i = 0; i < 2; ++i) out[pick(['k', 'key two', 'é'])] = randomValue(depth + 1);
      return out;
    }
  }
  throw new Error('gen: unhandled schema ' + JSON.stringify(schema));
}
function randomValue(depth) {
  const r = rand();
  if (depth > 2 || r < 0.5) return pick([pick(STRINGS), 7, -2.5, true, false, null]);
  if (r < 0.75) return [randomValue(depth + 1)];
  return { x: randomValue(depth + 1) };
}
// Value-level mutation: replace a random node with a primitive, delete a key, or add one.
function mutate(doc) {
  const copy = JSON.parse(JSON.stringify(doc));
  const nodes = [];
  const walk = (v, parent, key) => {
    nodes.push([parent, key, v]);
    if (v && typeof v === 'object') for (const k of Object.keys(v)) walk(v[k], v, k);
  };
  walk(copy, null, null);
  const [parent, key, v] = pick(nodes);
  const r = rand();
  if (parent === null) return pick(['x', 5, null, [], {}]);
  if (r < 0.5) parent[key] = pick(['x', 5, 1.5, null, true, [], {}]);
  else if (r < 0.75 && !Array.isArray(parent)) delete parent[key];
  else if (v && typeof v === 'object' && !Array.isArray(v)) v.zz_extra = 1;
  else parent[key] = 'mutated';
  return copy;
}
function mutateText(text) {
  const t = Array.from(text);  // code points: never split a surrogate pair
  const i = Math.floor(rand() * (t.length + 1));
  const r = rand();
  if (r < 0.3) return t.slice(0, i).join('');
  if (r < 0.6) return t.slice(0, i).join('') + t.slice(i + 1).join('');
  return t.slice(0, i).join('') + pick(['"', '}', ']', ',', ' ', '  ', '0', 'a', '\\', ':', '\n']) + t.slice(i).join('');
}

function runOracle(args, input) {
  const r = spawnSync(binary, args, { input, encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`structured_oracle ${args.join(' ')} failed (${r.status}): ${r.stderr}`);
  return r.stdout.trim().split('\n');
}

const cases = [
  { name: 'person', exact: true, schema: {
    type: 'object', additionalProperties: false, required: ['name', 'age'],
    properties: {
      name: { type: 'string' }, age: { type: 'integer' }, email: { type: 'string' },
      tags: { type: 'array', items: { type: 'string' }, maxItems: 3 },
      address: { type: 'object', additionalProperties: false, required: ['street'],
        properties: { street: { type: 'string' }, zip: { type: 'string' } } },
    } } },
  { name: 'enum-const-anyOf', exact: true, schema: {
    type: 'object', additionalProperties: false, required: ['color', 'kind'],
    properties: {
      color: { enum: ['red', 'green', 'blue'] }, size: { anyOf: [{ type: 'integer' }, { type: 'null' }] },
      kind: { const: 'fixed' }, flag: { type: 'boolean' }, score: { type: 'number' },
    } } },
  { name: 'array-root', exact: true, schema: { type: 'array', items: { type: 'number' }, minItems: 1, maxItems: 4 } },
  { name: 'recursive-ref', exact: true, schema: {
    $defs: { node: { type: 'object', additionalProperties: false, required: ['value'],
      properties: { value: { type: 'integer' }, children: { type: 'array', maxItems: 2, items: { $ref: '#/$defs/node' } } } } },
    $ref: '#/$defs/node' } },
  { name: 'oneOf-disjoint', exact: true, schema: { oneOf: [{ type: 'string' },
    { type: 'object', properties: { x: { type: 'number' } }, required: ['x'], additionalProperties: false }] } },
  { name: 'type-list', exact: true, schema: { type: ['string', 'null'] } },
  { name: 'map-of-integers', exact: true, schema: { type: 'object', additionalProperties: { type: 'integer' } } },
  { name: 'json_object', exact: true, spec: { json_object: true }, schema: { type: 'object' } },
  { name: 'not-strict', exact: false, schema: { type: 'object', properties: { a: { type: 'string' } } } },
  // Value keywords (issue 35): bounds, multipleOf, lengths exactly as ajv judges them; patterns soundly (the
  // grammar writes no escapes inside a pattern string, so it accepts a subset of ajv's strings).
  { name: 'value-keywords', exact: true, schema: {
    type: 'object', additionalProperties: false, required: ['n', 's'],
    properties: {
      n: { type: 'integer', minimum: -5, maximum: 600 }, s: { type: 'string', minLength: 1, maxLength: 11 },
      x: { type: 'number', exclusiveMinimum: -1, maximum: 3.25 }, m: { type: 'integer', multipleOf: 3 },
    } } },
  { name: 'patterns', exact: false, schema: {
    type: 'object', additionalProperties: false, required: ['p'],
    properties: { p: { type: 'string', pattern: '^[a-z]+( [a-z]+)*$' }, q: { type: 'string', pattern: 'o' } } } },
];

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mxserve-grammar-oracle-'));
let failures = 0, checked = 0;
const fail = (msg) => { ++failures; if (failures <= 20) console.error('FAIL ' + msg); };
try {
  for (const c of cases) {
    const specFile = path.join(tmp, c.name + '.json');
    fs.writeFileSync(specFile, JSON.stringify(c.spec ?? { schema: c.schema }));
    const validate = ajv.compile(c.schema);
    // (a) generated by constrained decoding
    const generated = runOracle(['generate', specFile, '60', String(1000 + checked)]).map((l) => JSON.parse(l));
    const done = generated.filter((g) => g !== null);
    if (done.length < 40) fail(`${c.name}: only ${done.length}/60 generated documents ended`);
    for (const text of done) {
      let v;
      try { v = JSON.parse(text); } catch (e) { fail(`${c.name}: generated text is not JSON: ${JSON.stringify(text)}`); continue; }
      if (!validate(v)) fail(`${c.name}: generated ${JSON.stringify(text)} fails the schema: ${ajv.errorsText(validate.errors)}`);
      ++checked;
    }
    // (b) candidates classified by the grammar
    const canon = [], noisy = [];
    for (let i = 0; i < 80; ++i) {
      const doc = gen(c.schema, c.schema);
      canon.push(JSON.stringify(doc));
      canon.push(JSON.stringify(mutate(doc)));
      noisy.push(mutateText(JSON.stringify(doc)));
    }
    for (const t of done) noisy.push(t);
    const texts = [...canon, ...noisy];
    const verdicts = runOracle(['check', specFile], texts.map((t) => JSON.stringify(t)).join('\n') + '\n');
    let accepted = 0, rejected = 0;
    texts.forEach((t, i) => {
      let valid = false;
      try { valid = validate(JSON.parse(t)); } catch (e) { valid = false; }
      const acc = verdicts[i] === '1';
      accepted += acc; rejected += !acc;
      if (acc && !valid) fail(`${c.name}: grammar accepts invalid ${JSON.stringify(t)}`);
      if (c.exact && i < canon.length && valid && !acc) fail(`${c.name}: grammar rejects valid canonical ${JSON.stringify(t)}`);
      if (i >= texts.length - done.length && !acc) fail(`${c.name}: grammar rejects its own output ${JSON.stringify(t)}`);
      ++checked;
    });
    if (accepted === 0 || rejected === 0) fail(`${c.name}: the candidates did not exercise both verdicts (${accepted}/${rejected})`);
    console.log(`${c.name}: ${done.length} generated documents valid; ${texts.length} candidates, ${accepted} accepted`);
  }
  // Choices: raw text, exactly one of the list.
  const choiceFile = path.join(tmp, 'choice.json');
  const choices = ['yes', 'no', 'maybe so', 'no way'];
  fs.writeFileSync(choiceFile, JSON.stringify({ choice: choices }));
  const gen2 = runOracle(['generate', choiceFile, '30', '7']).map((l) => JSON.parse(l));
  for (const g of gen2) if (!choices.includes(g)) fail(`choice: generated ${JSON.stringify(g)}`);
  const probes = ['yes', 'no', 'maybe so', 'no way', 'n', 'no ', 'maybe', 'yes!', '"yes"', ''];
  const v2 = runOracle(['check', choiceFile], probes.map((t) => JSON.stringify(t)).join('\n') + '\n');
  probes.forEach((t, i) => { if ((v2[i] === '1') !== choices.includes(t)) fail(`choice: verdict ${v2[i]} for ${JSON.stringify(t)}`); });
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
console.log(`${checked} checks, ${failures} failures`);
process.exit(failures ? 1 : 0);
