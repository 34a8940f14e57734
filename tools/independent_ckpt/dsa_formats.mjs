#!/usr/bin/env node
// Writes a glm_moe_dsa (GLM-5.x) fixture's weights in the checkpoint layouts GLM-5 is published in, with a
// writer independent of mxserve (plain Node, no mxserve code; the formats from their definitions):
//   fp8_release   the official GLM-5.x FP8 release layout (zai-org/GLM-5*-FP8; research/models-formats.md 4.7):
//                 X.weight F8_E4M3 [out, in] + X.weight_scale_inv F32 [ceil(out/B), ceil(in/B)] (B = --block,
//                 128 in the release), W = code * scale_inv, scale_inv = amax(block) / 448, codes e4m3fn rounded
//                 to nearest, ties to even, saturating at 448. Quantized, as in the release: every GEMM -- MLA
//                 (q_a, q_b, kv_a_proj_with_mqa, kv_b, o_proj), indexer wq_b and wk, dense / shared / routed
//                 MLPs, the MTP layer's too. Kept as stored (bf16 / f32): norms, embeddings, lm_head, the router
//                 mlp.gate (+ its f32 correction bias), indexer.weights_proj and the MTP eh_proj.
//                 quantization_config as the release writes it, quirk included: modules_to_not_convert lists
//                 "self_attn.indexers_proj" (a module that does not exist; the tensor is indexer.weights_proj)
//                 and does not list eh_proj.
//   mxfp4_quark   AMD Quark MXFP4 (research/models-formats.md 4.5; tools/independent_ckpt/mxfp4_quark.py is the
//                 numpy twin for glm4_moe): X.weight U8 [out, in/2] (element 2i low nibble) + X.weight_scale U8
//                 [out, ceil(in/32)] (E8M0, Quark's "even" rule). Quantized: the MLP Linears (dense, shared,
//                 routed) of the target layers. Kept bf16 and listed in exclude: attention (re:.*self_attn.*),
//                 the router (re:.*mlp.gate$), lm_head and every Linear of the MTP layer by exact module name.
//   bf16_sharded  the fixture's tensors unchanged, split over two shards + model.safetensors.index.json.
// Usage: node dsa_formats.mjs --fixture DIR --out DIR --format fp8_release|mxfp4_quark|bf16_sharded [--block N]
import fs from 'node:fs';
import path from 'node:path';

function parseArgs(argv) {
  const a = {block: 128};
  for (let i = 2; i < argv.length; i += 2) {
    const k = argv[i], v = argv[i + 1];
    if (v === undefined) throw new Error(`flag ${k} needs a value`);
    if (k === '--fixture') a.fixture = v;
    else if (k === '--out') a.out = v;
    else if (k === '--format') a.format = v;
    else if (k === '--block') a.block = Number.parseInt(v, 10);
    else throw new Error(`unknown flag ${k}`);
  }
  if (!a.fixture || !a.out || !['fp8_release', 'mxfp4_quark', 'bf16_sharded'].includes(a.format) || !(a.block > 0))
    throw new Error('usage: dsa_formats.mjs --fixture DIR --out DIR --format fp8_release|mxfp4_quark|bf16_sharded [--block N]');
  return a;
}

// ---- safetensors ----
const DTYPE_BYTES = {F32: 4, BF16: 2, F16: 2, U8: 1, F8_E4M3: 1, I64: 8, I32: 4};

function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const base = 8 + n, out = new Map();
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [b, e] = info.data_offsets;
    out.set(name, {dtype: info.dtype, shape: info.shape, bytes: buf.subarray(base + b, base + e)});
  }
  return out;
}

function writeSafetensors(file, tensors, writer) {
  const header = {__metadata__: {format: 'pt', writer}};
  let off = 0;
  const names = [...tensors.keys()].sort();
  for (const name of names) {
    const t = tensors.get(name);
    const want = t.shape.reduce((x, y) => x * y, 1) * DTYPE_BYTES[t.dtype];
    if (t.bytes.length !== want) throw new Error(`${name}: ${t.bytes.length} bytes for ${t.dtype} ${JSON.stringify(t.shape)}`);
    header[name] = {dtype: t.dtype, shape: t.shape, data_offsets: [off, off + t.bytes.length]};
    off += t.bytes.length;
  }
  let json = JSON.stringify(header);
  while ((8 + Buffer.byteLength(json)) % 8 !== 0) json += ' ';
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(json, 'utf8'), ...names.map((n) => tensors.get(n).bytes)]));
}

function toF32(t) {
  const n = t.shape.reduce((x, y) => x * y, 1), out = new Float32Array(n);
  if (t.dtype === 'F32') {
    for (let i = 0; i < n; ++i) out[i] = t.bytes.readFloatLE(4 * i);
  } else if (t.dtype === 'BF16') {
    const u = new Uint32Array(out.buffer);
    for (let i = 0; i < n; ++i) u[i] = t.bytes.readUInt16LE(2 * i) << 16;
  } else {
    throw new Error(`cannot read dtype ${t.dtype} as float`);
  }
  return out;
}

// ---- e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448 (0x7E); 0x7F is NaN; no infinities ----
function roundHalfEven(x) {
  const f = Math.floor(x), d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

function e4m3Code(v) {
  const sign = v < 0 || Object.is(v, -0) ? 0x80 : 0;
  const a = Math.abs(v);
  if (!(a < 448)) return sign | 0x7e;  // saturate (NaN input never occurs: amax is finite)
  if (a < 2 ** -6) return sign | roundHalfEven(a / 2 ** -9);  // subnormals m * 2^-9 (m = 8 is 2^-6, code 0x08)
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e -= 1;
  if (2 ** (e + 1) <= a) e += 1;
  let m = roundHalfEven((a / 2 ** e - 1) * 8);
  if (m === 8) { m = 0; e += 1; }
  if (e + 7 > 15 || (e + 7 === 15 && m === 7)) return sign | 0x7e;
  return sign | ((e + 7) << 3) | m;
}

function e4m3Value(code) {
  const s = code & 0x80 ? -1 : 1, e = (code >> 3) & 0xf, m = code & 7;
  return s * (e === 0 ? m * 2 ** -9 : (1 + m / 8) * 2 ** (e - 7));
}

// FP8 block: per [B, B] block (edge blocks partial), s = f32(amax / 448), codes = e4m3(f32(w / s)).
function quantizeFp8Block(w, rows, cols, B) {
  const gr = Math.ceil(rows / B), gc = Math.ceil(cols / B);
  const codes = Buffer.alloc(rows * cols), scales = Buffer.alloc(4 * gr * gc);
  for (let bi = 0; bi < gr; ++bi)
    for (let bj = 0; bj < gc; ++bj) {
      let amax = 0;
      for (let r = bi * B; r < Math.min(rows, (bi + 1) * B); ++r)
        for (let c = bj * B; c < Math.min(cols, (bj + 1) * B); ++c) amax = Math.max(amax, Math.abs(w[r * cols + c]));
      const s = Math.fround(amax > 0 ? amax / 448 : 1);
      scales.writeFloatLE(s, 4 * (bi * gc + bj));
      for (let r = bi * B; r < Math.min(rows, (bi + 1) * B); ++r)
        for (let c = bj * B; c < Math.min(cols, (bj + 1) * B); ++c) codes[r * cols + c] = e4m3Code(Math.fround(w[r * cols + c] / s));
    }
  return {codes, scales, grid: [gr, gc]};
}

// ---- MXFP4 (OCP MX v1.0 E2M1 elements, E8M0 scale per 32 along the input dimension) ----
const E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6];

// Quark's "even" scale rule: a = (bits(amax) + 0x200000) & 0x7F800000, byte = clamp(exp(a) - 2, 0, 254).
function evenScaleByte(amax) {
  const f = new Float32Array([amax]), u = new Uint32Array(f.buffer);
  const e = ((u[0] + 0x200000) & 0x7f800000) >>> 23;
  if (e === 255) return 254;
  return Math.min(254, Math.max(0, e - 2));
}

// Nearest E2M1 magnitude, ties to the even code, saturating at 6; the sign bit kept (-0 stays negative).
function e2m1Code(x) {
  const mag = Math.min(Math.abs(x), 6);
  let best = 0;
  for (let c = 1; c < 8; ++c) {
    const d = Math.abs(mag - E2M1[c]), bd = Math.abs(mag - E2M1[best]);
    if (d < bd || (d === bd && c % 2 === 0 && best % 2 !== 0)) best = c;
  }
  return best | (x < 0 || Object.is(x, -0) ? 8 : 0);
}

function quantizeMxfp4(w, rows, cols) {
  if (cols % 2 !== 0) throw new Error(`MXFP4 needs an even input width, got ${cols}`);
  const nb = Math.ceil(cols / 32);
  const packed = Buffer.alloc(rows * cols / 2), scales = Buffer.alloc(rows * nb);
  for (let r = 0; r < rows; ++r)
    for (let b = 0; b < nb; ++b) {
      const lo = b * 32, hi = Math.min(cols, lo + 32);
      let amax = 0;
      for (let c = lo; c < hi; ++c) amax = Math.max(amax, Math.abs(w[r * cols + c]));
      const byte = evenScaleByte(amax);
      scales[r * nb + b] = byte;
      const X = 2 ** (byte - 127);
      for (let c = lo; c < hi; ++c) {
        const code = e2m1Code(Math.fround(w[r * cols + c] / X));
        const i = r * cols + c;
        packed[i >> 1] |= i % 2 === 0 ? code : code << 4;
      }
    }
  return {packed, scales};
}

function selfCheck() {
  const eq = (a, b, what) => { if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`self-check ${what}: ${JSON.stringify(a)} != ${JSON.stringify(b)}`); };
  eq([0.25, 0.75, 2.5, 5, 7, -0.1, -6].map(e2m1Code), [0x0, 0x2, 0x4, 0x6, 0x7, 0x8, 0xf], 'e2m1');
  eq([6, 7, 0, 1].map(evenScaleByte), [127, 128, 0, 125], 'e8m0 even');
  eq([448, 500, 1, 0.5, 2 ** -9, 3 * 2 ** -10, 1.0625, 1.1875, -240].map(e4m3Code),
     [0x7e, 0x7e, 0x38, 0x30, 0x01, 0x02, 0x38, 0x3a, 0xf7], 'e4m3');
  for (let c = 0; c < 256; ++c)
    if ((c & 0x7f) !== 0x7f && e4m3Code(e4m3Value(c)) !== c && !(c === 0x80)) throw new Error(`self-check e4m3 round trip ${c}`);
}

// ---- which tensors ----
const layerOf = (name) => (name.startsWith('model.layers.') ? Number.parseInt(name.split('.')[2], 10) : -1);
const moduleOf = (name) => name.slice(0, -'.weight'.length);
const isLinear = (name, t) => name.endsWith('.weight') && t.shape.length === 2 && !name.includes('embed_tokens') &&
  name !== 'lm_head.weight' && !name.endsWith('shared_head.head.weight');

function fp8ReleaseQuantizes(name, t) {
  if (!isLinear(name, t)) return false;
  return !name.endsWith('.mlp.gate.weight') && !name.endsWith('.indexer.weights_proj.weight') && !name.endsWith('.eh_proj.weight');
}

function mxfp4QuarkQuantizes(name, t, nLayers) {
  return isLinear(name, t) && layerOf(name) < nLayers && name.includes('.mlp.') && name.endsWith('_proj.weight');
}

function main() {
  const a = parseArgs(process.argv);
  selfCheck();
  const cfg = JSON.parse(fs.readFileSync(path.join(a.fixture, 'config.json'), 'utf8'));
  if (cfg.model_type !== 'glm_moe_dsa') throw new Error(`${a.fixture}: model_type ${cfg.model_type}, expected glm_moe_dsa`);
  const nLayers = cfg.num_hidden_layers;
  const src = readSafetensors(path.join(a.fixture, 'model.safetensors'));
  fs.mkdirSync(a.out, {recursive: true});
  const writer = `tools/independent_ckpt/dsa_formats.mjs --format ${a.format}`;
  const out = new Map();
  let nQuant = 0;
  if (a.format === 'bf16_sharded') {
    const names = [...src.keys()].sort(), half = Math.ceil(names.length / 2);
    const shards = [new Map(), new Map()], weightMap = {};
    names.forEach((n, i) => {
      const s = i < half ? 0 : 1;
      shards[s].set(n, src.get(n));
      weightMap[n] = `model-0000${s + 1}-of-00002.safetensors`;
    });
    shards.forEach((m, s) => writeSafetensors(path.join(a.out, `model-0000${s + 1}-of-00002.safetensors`), m, writer));
    fs.writeFileSync(path.join(a.out, 'model.safetensors.index.json'), JSON.stringify({metadata: {}, weight_map: weightMap}, null, 2));
  } else {
    const exclude = ['lm_head', 're:.*self_attn.*', 're:.*mlp.gate$'];
    for (const [name, t] of src) {
      const rows = t.shape[0], cols = t.shape[1];
      if (a.format === 'fp8_release' && fp8ReleaseQuantizes(name, t)) {
        const q = quantizeFp8Block(toF32(t), rows, cols, a.block);
        out.set(name, {dtype: 'F8_E4M3', shape: [rows, cols], bytes: q.codes});
        out.set(`${moduleOf(name)}.weight_scale_inv`, {dtype: 'F32', shape: q.grid, bytes: q.scales});
        ++nQuant;
      } else if (a.format === 'mxfp4_quark' && mxfp4QuarkQuantizes(name, t, nLayers)) {
        const q = quantizeMxfp4(toF32(t), rows, cols);
        out.set(name, {dtype: 'U8', shape: [rows, cols / 2], bytes: q.packed});
        out.set(`${moduleOf(name)}.weight_scale`, {dtype: 'U8', shape: [rows, Math.ceil(cols / 32)], bytes: q.scales});
        ++nQuant;
      } else {
        out.set(name, t);
        if (a.format === 'mxfp4_quark' && layerOf(name) >= nLayers && isLinear(name, t) && !name.includes('self_attn') &&
            !name.endsWith('.mlp.gate.weight'))
          exclude.push(moduleOf(name));
      }
    }
    writeSafetensors(path.join(a.out, 'model.safetensors'), out, writer);
    if (a.format === 'fp8_release') {
      const notConvert = ['model.embed_tokens', 'lm_head'];
      for (let l = 0; l <= nLayers; ++l)
        if (src.has(`model.layers.${l}.self_attn.indexer.weights_proj.weight`)) notConvert.push(`model.layers.${l}.self_attn.indexers_proj`);
      cfg.quantization_config = {activation_scheme: 'dynamic', fmt: 'e4m3', quant_method: 'fp8',
                                 weight_block_size: [a.block, a.block], modules_to_not_convert: notConvert};
    } else {
      const weight = {dtype: 'fp4', qscheme: 'per_group', group_size: 32, ch_axis: -1, is_dynamic: false, scale_format: 'e8m0',
                      scale_type: 'float', scale_calculation_mode: 'even', round_method: 'half_even',
                      observer_cls: 'PerBlockMXObserver', symmetric: null, mx_element_dtype: null, is_scale_quant: false};
      cfg.quantization_config = {quant_method: 'quark', quant_mode: 'eager_mode',
                                 global_quant_config: {weight, input_tensors: null, output_tensors: null, bias: null, target_device: null},
                                 exclude, layer_quant_config: {}, layer_type_quant_config: {}, kv_cache_quant_config: {},
                                 export: {kv_cache_group: [], min_kv_scale: 0.0, pack_method: 'reorder',
                                          weight_format: 'real_quantized', weight_merge_groups: null}};
    }
  }
  fs.writeFileSync(path.join(a.out, 'config.json'), JSON.stringify(cfg, null, 2) + '\n');
  for (const f of ['generation_config.json', 'reference.safetensors'])
    if (fs.existsSync(path.join(a.fixture, f))) fs.copyFileSync(path.join(a.fixture, f), path.join(a.out, f));
  console.log(`${a.out}: ${a.format}, ${nQuant} quantized tensors`);
}

main();
