// Reference chat-template renderer for mxserve's template conformance test: @huggingface/jinja
// (the renderer transformers.js uses), with the context transformers.js builds in
// apply_chat_template: messages, add_generation_prompt, tools (null when absent), documents
// (null), the special tokens named in tokenizer_config.json, then the extra kwargs.
// Usage: node render_ref.mjs NODE_MODULES TEMPLATE_FILE|- CONFIG_JSON|- CASES_JSON
//   TEMPLATE_FILE "-" takes chat_template from CONFIG_JSON.
// Prints one JSON object per (case, variant): {"ok": true, "out": "..."} or {"ok": false, "error": "..."}.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [nodeModules, templatePath, configPath, casesPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const { Template } = require("@huggingface/jinja");
const config = configPath === "-" ? {} : JSON.parse(fs.readFileSync(configPath, "utf8"));
const source = templatePath === "-" ? config.chat_template : fs.readFileSync(templatePath, "utf8");
const { cases, variants } = JSON.parse(fs.readFileSync(casesPath, "utf8"));

function specialTokens() {
  const out = {};
  for (const key of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
    const item = config[key];
    if (!item) continue;
    if (typeof item === "object") { if (item.content) out[key] = item.content; } else out[key] = item;
  }
  return out;
}

let template = null, parseError = null;
try { template = new Template(source); } catch (e) { parseError = String(e.message ?? e); }
const lines = [];
for (const c of cases) {
  for (const v of variants) {
    if (parseError) { lines.push(JSON.stringify({ ok: false, error: "parse: " + parseError })); continue; }
    try {
      const ctx = {
        messages: c.messages, add_generation_prompt: v.add_generation_prompt, tools: c.tools ?? null,
        documents: null, ...specialTokens(), ...(v.kwargs ?? {}),
      };
      lines.push(JSON.stringify({ ok: true, out: template.render(ctx) }));
    } catch (e) {
      lines.push(JSON.stringify({ ok: false, error: String(e.message ?? e) }));
    }
  }
}
process.stdout.write(lines.join("\n") + "\n");
