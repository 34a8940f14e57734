// Reference encoder for mxserve's tokenizer conformance test: @lenml/tokenizers (a port of
// transformers.js), an implementation independent of mxserve.
// Usage: node encode_ref.mjs NODE_MODULES PACKAGE CORPUS.jsonl [--no-special] [--bench]
//   PACKAGE: qwen3 | deepseek_v3 | gptoss | llama3
// Prints one JSON array of ids per corpus line (each line is a JSON string). With --bench it
// prints only {"bytes": N, "seconds": S}: the best of two passes over the corpus after a warm-up pass.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [nodeModules, pkg, corpusPath, ...flags] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const { fromPreTrained } = require(`@lenml/tokenizer-${pkg}`);
const tok = fromPreTrained();
const addSpecial = !flags.includes("--no-special");
const lines = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));

if (flags.includes("--bench")) {
  // One full warm-up pass (JIT, caches), then the best of two timed passes.
  let bytes = 0;
  for (const t of lines) { tok.encode(t, { add_special_tokens: addSpecial }); bytes += Buffer.byteLength(t, "utf8"); }
  let best = Infinity;
  for (let rep = 0; rep < 2; ++rep) {
    const t0 = process.hrtime.bigint();
    for (const t of lines) tok.encode(t, { add_special_tokens: addSpecial });
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  process.stdout.write(JSON.stringify({ bytes, seconds: best }) + "\n");
} else {
  const out = [];
  for (const t of lines) out.push(JSON.stringify(tok.encode(t, { add_special_tokens: addSpecial })));
  process.stdout.write(out.join("\n") + "\n");
}
