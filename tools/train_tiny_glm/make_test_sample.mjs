// Writes the CPU tests' held-out sample of the tiny trained GLM (issue 22): the first 3 documents of the
// held-out split, their token ids from @lenml/tokenizers (the independent reference mxserve's tokenizer must
// match) and the unigram perplexity of those tokens under the TRAIN split's token counts (add-one smoothing):
// the baseline the trained model's perplexity is compared with. Deterministic.
//   node tools/train_tiny_glm/make_test_sample.mjs tests/data/node_modules tools/train_tiny_glm/data tests/data/tiny_glm
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [nodeModules, dataDir, outDir] = process.argv.slice(2);
if (!nodeModules || !dataDir || !outDir) {
  console.error("usage: node make_test_sample.mjs NODE_MODULES DATA_DIR OUT_DIR");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");
const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dataDir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dataDir, "tokenizer_config.json"), "utf8"));
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const text = fs.readFileSync(path.join(dataDir, "heldout.txt"), "utf8").split("\n\n\n").slice(0, 3).join("\n\n\n") + "\n";
const ids = tok.encode(text, { add_special_tokens: false });
const train = fs.readFileSync(path.join(dataDir, "train.u16"));
const V = tokenizerJSON.added_tokens.reduce((m, a) => Math.max(m, a.id + 1), Object.keys(tokenizerJSON.model.vocab).length);
const counts = new Float64Array(V).fill(1);
for (let i = 0; i < train.length; i += 2) counts[train.readUInt16LE(i)] += 1;
const total = counts.reduce((a, b) => a + b, 0);
let nll = 0;
for (let i = 1; i < ids.length; ++i) nll -= Math.log(counts[ids[i]] / total);
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "heldout_sample.txt"), text);
const meta = { source: "tools/train_tiny_glm/make_test_sample.mjs: the first 3 documents of the held-out split",
  tokens: ids.length, unigram_perplexity: Math.exp(nll / (ids.length - 1)), unigram_vocab: V, ids };
fs.writeFileSync(path.join(outDir, "heldout_sample.json"), JSON.stringify(meta) + "\n");
console.log(JSON.stringify({ ...meta, ids: undefined }));
