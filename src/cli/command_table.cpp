// The `mxserve` command table (see command_table.h). One entry per command and subcommand; each entry's flags are
// exactly the flags its parser accepts (tests/cli/test_cli_help.sh compares them), with the value a flag takes,
// its default and one line of help.
#include "cli/command_table.h"

#include <algorithm>

// Entries leave trailing members (subcommands, own_help) at their defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace mxserve::cli {
namespace {

using F = FlagHelp;
std::vector<F> cat(std::vector<F> a, const std::vector<F>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Shared groups (cli/spec_flags.h, cli/graph_flags.h, cli/parallel_flags.h).
const std::vector<F>& spec_flags() {
  static const std::vector<F> v = {
      {"", "", "", "speculative decoding (MTP; docs/speculative.md)"},
      {"--speculative-algorithm", "mtp", "", "draft with the model's MTP layer (aliases NEXTN, EAGLE); off when absent"},
      {"--speculative-config", "JSON", "", "vLLM spelling: {\"method\": \"mtp\", \"num_speculative_tokens\": N}"},
      {"--speculative-num-steps", "N", "3", "drafted tokens per step; the tree depth in tree mode"},
      {"--speculative-eagle-topk", "K", "1", "1: chain mode; K > 1: tree mode, K children per expanded node"},
      {"--speculative-num-draft-tokens", "M", "", "tree mode: verify the best M - 1 draft nodes (chain: N + 1)"},
      {"--speculative-simulate-acceptance", "A", "", "accept drafts at this simulated mean length (benchmarks only: "
                                                    "the output is MEANINGLESS)"},
      {"--no-speculative-adaptive", "", "", "keep N fixed (by default N drops when drafts are not accepted)"},
      {"--speculative-skip-self-test", "", "", "skip the post-load acceptance self-test"},
  };
  return v;
}
const std::vector<F>& graph_flags() {
  static const std::vector<F> v = {
      {"--cuda-graph", "", "on with --backend cuda", "replay CUDA graphs for decode steps (and chain MTP verify / draft steps)"},
      {"--disable-cuda-graph", "", "", "keep every step eager (sglang spelling)"},
      {"--enforce-eager", "", "", "keep every step eager (vLLM spelling)"},
  };
  return v;
}
const std::vector<F>& parallel_flags() {
  static const std::vector<F> v = {
      {"", "", "", "parallel (docs/parallel.md)"},
      {"--tensor-parallel-size", "N", "1", "ranks the model is split over (one thread each; cuda: one GPU each)"},
      {"--tp-size", "N", "1", "alias of --tensor-parallel-size"},
      {"--data-parallel-size", "N", "1", "data-parallel ranks, requests placed by prefix hit / free KV / load"},
      {"--dp-size", "N", "1", "alias of --data-parallel-size"},
      {"--ep-size", "N", "1", "routed experts partitioned whole over N ranks (1, tp or tp x dp)"},
      {"--enable-expert-parallel", "", "", "expert parallel over all ranks: --ep-size tp x dp (vLLM)"},
      {"--enable-dp-attention", "", "", "attention per dp rank, MoE blocks spread over all ranks (dp > 1)"},
      {"--expert-parallel-size", "N", "1", "alias of --ep-size (sglang)"},
      {"--nnodes", "N", "1", "nodes, one process each (tp spans them; node 0 serves HTTP)"},
      {"--node-rank", "R", "0", "this node's rank; R > 0 (serve): a follower that runs node 0's steps"},
      {"--dist-init-addr", "HOST:PORT", "", "node 0's rendezvous address (multi-node)"},
      {"--dist-timeout", "S", "300", "multi-node: start-up and per-collective timeout in seconds"},
      {"--communicator", "nccl|shared-device|auto", "auto", "cuda only; shared-device: every rank on ONE GPU, "
                                                          "collectives through device memory (a test stand-in)"},
      {"--disable-custom-all-reduce", "", "", "tp > 1: all-reduce, add and RMSNorm as three steps instead of the fused "
                                              "kernel (the default on cuda; vLLM's flag)"},
  };
  return v;
}

std::vector<CommandHelp> build_table() {
  std::vector<CommandHelp> t;
  t.push_back({"serve", "OpenAI-compatible HTTP server",
               "(--model DIR | --config FILE --synthetic-weights) [flags]",
               cat(cat(cat({
                   {"", "", "", "model"},
                   {"--model", "DIR", "", "checkpoint directory (config.json + *.safetensors + tokenizer files)"},
                   {"--config", "FILE", "", "a config.json (or its directory), with --synthetic-weights"},
                   {"--synthetic-weights", "", "", "deterministic random weights instead of a checkpoint"},
                   {"--num-layers", "N", "all", "keep the first N decoder layers (synthetic weights)"},
                   {"--seed", "N", "0", "synthetic weight seed"},
                   {"--quantization", "EXPERTS[:REST]", "bf16", "synthetic weights' precision, each mxfp4|fp8-block|bf16"},
                   {"--tokenizer", "DIR", "the --model directory", "tokenizer.json + tokenizer_config.json"},
                   {"--backend", "cpu|cuda", "cpu", "where the model runs"},
                   {"--moe-tuning-dir", "DIR", "", "MoE kernel tables (from `mxserve tune-moe`) overriding the built-in ones"},
                   {"", "", "", "server"},
                   {"--host", "ADDR", "127.0.0.1", "address to listen on (0.0.0.0: all interfaces)"},
                   {"--port", "N", "8000", "port to listen on"},
                   {"--served-model-name", "NAME", "the --model path", "the model id clients send"},
                   {"--api-key", "KEY", "", "require 'Authorization: Bearer KEY' on /v1/*"},
                   {"--max-request-body-bytes", "N", "8388608", "larger decoded request bodies get a 413"},
                   {"--http-threads", "N", "2048", "requests handled at once"},
                   {"--max-connections", "N", "8192", "open connections; beyond, the longest-idle one is closed"},
                   {"--max-header-bytes", "N", "32768", "larger request heads get a 431"},
                   {"--max-header-count", "N", "100", "more header fields get a 431"},
                   {"--http-header-timeout", "S", "10", "a request head must arrive within S seconds"},
                   {"--http-body-timeout", "S", "60", "a request body must arrive within S seconds of its head"},
                   {"--http-keepalive-timeout", "S", "30", "an idle kept-alive connection is closed after S seconds"},
                   {"--http-write-timeout", "S", "30", "a client that reads nothing for S seconds is dropped"},
                   {"--max-logprobs", "N", "20", "largest top_logprobs / completions logprobs"},
                   {"--max-logprob-entries", "N", "262144", "non-streaming: n x max_tokens x (top_logprobs + 1) above is a 400"},
                   {"--stats-interval", "S", "10", "seconds between stats log lines (0: off)"},
                   {"--shutdown-timeout", "S", "10", "on SIGINT/SIGTERM, wait this long for in-flight requests"},
                   {"--log-level", "debug|info|warn|error", "info", "log verbosity"},
                   {"", "", "", "runtime (docs/scheduling.md)"},
                   {"--max-model-len", "N", "max_position_embeddings", "prompt + output limit (capped by the KV cache)"},
                   {"--max-num-seqs", "N", "256", "running requests per step"},
                   {"--max-num-batched-tokens", "N", "2048 (8192 on cuda)", "tokens per step"},
                   {"--chunked-prefill-size", "N", "2048 (8192 on cuda)", "prefill tokens per step"},
                   {"--max-itl-ms", "MS", "50", "ITL target: a step with decodes takes only the prefill that fits (0: off)"},
                   {"--min-prefill-chunk", "N", "256", "prefill tokens a step with decodes always gets"},
                   {"--slo-ttft-ms", "MS", "0", "TTFT target: waiting prefills ordered by deadline, bigger chunks near "
                                               "it (0 = off, FCFS; docs/scheduling.md)"},
                   {"--slo-ttft-over-itl", "", "", "with --slo-ttft-ms: a prefill that meets its deadline only past --max-itl-ms takes "
                                               "the bigger chunk (off: the ITL bound always holds)"},
                   {"--block-size", "N", "16", "tokens per KV block"},
                   {"--kv-cache-memory", "SIZE", "CUDA: from the device; CPU: 1GiB", "KV pool size per rank, e.g. 4GiB (CUDA: checked against the device at start-up; left out, the pool is what --gpu-memory-utilization leaves)"},
                   {"--gpu-memory-utilization", "F", "0.9", "CUDA: share of each GPU for weights + forward peak + KV; without --kv-cache-memory it sizes the KV pool (split among ranks sharing a GPU)"},
                   {"--num-kv-blocks", "N", "", "KV pool size in blocks (overrides --kv-cache-memory)"},
                   {"--kv-cache-dtype", "auto|bf16|fp8_e4m3|fp8", "auto", "KV element type (auto: bf16 on cuda, f32 on cpu)"},
                   {"--moe-activation-dtype", "bf16|fp8_e4m3", "bf16", "MXFP4 experts' prefill activations (fp8: cuda)"},
                   {"--disable-cascade-attention", "", "", "every decode row reads its whole context (cuda: by default "
                                                           "shared prefixes are attended once per group where it pays; "
                                                           "docs/kv-cache.md)"},
                   {"--enable-cascade-attention", "", "", "accepted no-op alias of the default (cascade on where it "
                                                          "pays; it forces nothing)"},
                   {"--disable-prefix-cache", "", "", "no prefix caching"},
                   {"--disable-radix-cache", "", "", "alias of --disable-prefix-cache (sglang)"},
                   {"--no-enable-prefix-caching", "", "", "alias of --disable-prefix-cache (vLLM)"},
                   {"--max-queued-requests", "N", "1024", "waiting requests beyond which new ones get 503 + Retry-After"},
                   {"--kv-cache-host-memory", "SIZE", "0", "host-memory KV tier for evicted prefix blocks, e.g. 32GiB "
                                                           "(0 = off; docs/kv-cache.md)"},
                   {"--step-log", "FILE", "", "one JSON line per engine step (shape, seconds, graph, prediction) for "
                                              "`mxserve simulate --fit-step-log`"},
                   {"--allowed-origins", "LIST", "", "CORS: origins a browser page may call from (comma list or JSON "
                                                      "list, * = any); off by default"},
                   {"--spec-acceptance-alarm", "B", "0.2", "warn when the first draft is accepted in fewer than B of "
                                                           "the last --spec-acceptance-window verify steps (0 = off)"},
                   {"--spec-acceptance-window", "N", "256", "verify steps the acceptance alarm judges"},
                   {"", "", "", "chat output (docs/server.md)"},
                   {"--tool-call-parser", "glm45|glm47|none", "from the chat template", "tool-call format"},
                   {"--reasoning-parser", "glm45|none", "from the chat template", "<think> -> reasoning_content"},
                   {"--benchmark-mode", "", "", "allow benchmark-only settings (--speculative-simulate-acceptance)"},
               }, graph_flags()), spec_flags()), parallel_flags()),
               "mxserve serve --model models/tiny-glm-trained --port 8000\n"
               "mxserve serve --model DIR --backend cuda --kv-cache-memory 20GiB --tp-size 2"});
  t.push_back({"generate", "greedy-decode token ids with a model",
               "(--model DIR | --config FILE --synthetic-weights) (--ids 1,2,3 | --prompt-len L) [flags]",
               cat(cat(cat({
                   {"--model", "DIR", "", "checkpoint directory"},
                   {"--config", "FILE", "", "a config.json, with --synthetic-weights"},
                   {"--synthetic-weights", "", "", "deterministic random weights instead of a checkpoint"},
                   {"--num-layers", "N", "all", "keep the first N decoder layers (synthetic weights)"},
                   {"--seed", "N", "0", "synthetic weight seed"},
                   {"--quantization", "EXPERTS[:REST]", "bf16", "synthetic weights' precision, each mxfp4|fp8-block|bf16"},
                   {"--ids", "LIST", "", "the prompt's token ids, comma-separated"},
                   {"--prompt-len", "L", "", "a synthetic prompt of L tokens instead of --ids"},
                   {"--batch", "B", "1", "identical requests decoded together"},
                   {"--max-tokens", "N", "16", "tokens to generate"},
                   {"--ignore-eos", "", "", "keep going past an end-of-sequence token"},
                   {"--backend", "cpu|cuda", "cpu", "where the model runs"},
                   {"--block-size", "N", "16", "tokens per KV block"},
                   {"--kv-cache-dtype", "auto|bf16|fp8_e4m3|fp8", "auto", "KV element type"},
                   {"--moe-tuning-dir", "DIR", "", "MoE kernel tables overriding the built-in ones"},
                   {"--runs", "SPEC", "", "several engine runs: \"b=1,n=0;b=8,n=3,a=2,adaptive=0,p=20,k=,m=\" (RESULT lines)"},
               }, graph_flags()), spec_flags()), parallel_flags()),
               "mxserve generate --model models/tiny-glm-trained --ids 1,2,3 --max-tokens 8"});
  t.push_back({"verify-fixture", "check a model against a golden fixture directory", "DIR [flags]",
               cat(cat({
                   {"--backend", "cpu|cuda", "cpu", "where the model runs"},
                   {"--block-size", "N", "16", "tokens per KV block"},
                   {"--chunk-size", "N", "7", "prefill chunk size"},
                   {"--max-rel-l2", "X", "1e-4", "largest relative L2 error of the logits"},
                   {"--kv-cache-dtype", "auto|bf16|fp8_e4m3|fp8", "auto", "KV element type (fp8: raise --max-rel-l2)"},
                   {"--decision-aware", "", "on for bf16 backends", "judge argmax / top-k decisions, not only logits"},
               }, graph_flags()), parallel_flags()),
               "mxserve verify-fixture tests/fixtures/glm4_moe_tiny_a --backend cpu"});
  t.push_back({"inspect", "list a checkpoint's tensors and its per-layer precision map", "DIR|FILE.safetensors", {},
               "mxserve inspect models/tiny-glm-trained"});
  t.push_back({"memory", "per-GPU weight / KV memory and link bytes per token of a parallel layout (no weights read)",
               "(--config FILE|DIR | --model DIR) [layout flags] [flags]",
               cat(cat({
                   {"--config", "FILE|DIR", "", "a config.json (or its directory)"},
                   {"--model", "DIR", "", "a checkpoint directory (only its config.json is read)"},
                   {"--num-layers", "N", "all", "keep the first N decoder layers"},
                   {"--quantization", "EXPERTS[:REST]", "bf16", "stored precision, each mxfp4|fp8-block|bf16"},
                   {"--kv-cache-dtype", "auto|bf16|fp8_e4m3|fp8", "auto", "KV element type"},
                   {"--gpu-memory", "BYTES", "", "one GPU's memory (e.g. 141GiB, 80GiB): prints the KV tokens that fit"},
                   {"--gpu-memory-utilization", "F", "0.9", "share of --gpu-memory for weights + KV"},
                   {"--json", "", "", "one JSON object instead of text"},
               }, spec_flags()), parallel_flags()),
               "mxserve memory --config /work/shared/models/GLM-5.2 --quantization mxfp4 --tp-size 4 --dp-size 2 "
               "--enable-dp-attention --ep-size 8 --gpu-memory 141GiB"});
  t.push_back({"quantize", "bf16 checkpoint -> MXFP4 (Quark) or FP8", "--in DIR --out DIR --scheme SCHEME [flags]",
               {
                   {"--in", "DIR", "", "the bf16 checkpoint"},
                   {"--out", "DIR", "", "where the quantized checkpoint is written"},
                   {"--scheme", "mxfp4|fp8-block|fp8-channel|fp8-tensor", "", "the target precision"},
                   {"--scale-rule", "even|floor|ceil", "even", "MXFP4 shared-exponent rounding"},
                   {"--exclude", "GLOB", "", "tensors kept in bf16 (repeatable)"},
                   {"--quantize-shared-experts", "", "", "quantize the shared experts too"},
                   {"--mtp-layer", "same|bf16", "same", "the MTP layer's precision"},
                   {"--shard-size-mb", "N", "4096", "output shard size"},
               },
               "mxserve quantize --in models/tiny-glm-trained --out /tmp/tiny-mxfp4 --scheme mxfp4"});
  t.push_back({"compare", "KL, top-1 agreement, logit cosine and perplexity of two models",
               "--model A --model B --prompts FILE [flags]",
               {
                   {"--model", "DIR", "", "a checkpoint directory; give it twice (A, then B)"},
                   {"--prompts", "FILE", "", "token-id lines (comma or space separated)"},
                   {"--text", "FILE", "", "token-id lines scored for perplexity"},
                   {"--backend", "cpu|cuda", "cpu", "where the models run"},
               },
               "mxserve compare --model models/tiny-glm-trained --model /tmp/tiny-mxfp4 --prompts ids.txt"});
  t.push_back({"eval", "model quality on real text: perplexity | compare | acceptance (MTP) | tasks (any server)",
               "SUBCOMMAND [flags]", {},
               "mxserve eval perplexity --model models/tiny-glm-trained --text README.md --max-tokens 256",
               {"perplexity", "compare", "acceptance", "tasks"}});
  t.push_back({"tokenize", "text lines on stdin -> token ids (JSON arrays)", "--tokenizer DIR|FILE [--no-special]",
               {
                   {"--tokenizer", "DIR|FILE", "", "a tokenizer.json or the directory holding it"},
                   {"--no-special", "", "", "do not add special tokens"},
               },
               "echo 'Hello world' | mxserve tokenize --tokenizer models/tiny-glm-trained"});
  t.push_back({"detokenize", "JSON id arrays on stdin -> text", "--tokenizer DIR|FILE [--skip-special] [--json]",
               {
                   {"--tokenizer", "DIR|FILE", "", "a tokenizer.json or the directory holding it"},
                   {"--skip-special", "", "", "drop special tokens from the text"},
                   {"--json", "", "", "print each text as a JSON string"},
               },
               "echo '[9707, 1879]' | mxserve detokenize --tokenizer models/tiny-glm-trained"});
  t.push_back({"render-chat", "render a chat template",
               "(--tokenizer-config DIR|FILE | --template FILE.jinja) --messages FILE.json [flags]",
               {
                   {"--tokenizer-config", "DIR|FILE", "", "a tokenizer_config.json or the directory holding it"},
                   {"--template", "FILE", "", "a Jinja chat template instead"},
                   {"--messages", "FILE", "", "a JSON array of messages"},
                   {"--tools", "FILE", "", "an OpenAI `tools` array (JSON)"},
                   {"--kwargs", "JSON", "", "extra template variables, e.g. '{\"enable_thinking\":false}'"},
                   {"--add-generation-prompt", "", "", "end with the assistant turn's opening"},
               },
               "mxserve render-chat --tokenizer-config models/tiny-glm-trained --messages msgs.json "
               "--add-generation-prompt"});
  t.push_back({"parse-output", "parse model output text with the chat output parsers",
               "--parser glm45|glm47|none [flags] FILE ('-' = stdin)",
               {
                   {"--parser", "glm45|glm47|none", "", "tool-call format: glm45 (GLM-4.5/4.6) or glm47 (GLM-4.7/5.x)"},
                   {"--reasoning-parser", "glm45|none", "glm45", "<think> handling"},
                   {"--tools", "FILE", "", "an OpenAI `tools` array: names checked, arguments converted"},
                   {"--chunk-size", "N", "all at once", "feed N bytes at a time through the streaming parser"},
                   {"--starts-in-reasoning", "", "", "the prompt ended inside <think>"},
               },
               "mxserve parse-output --parser glm45 output.txt"});
  t.push_back({"bench", "load-test an OpenAI-compatible server (RPS sweep, TTFT knee, cost)",
               "--base-url http://HOST:PORT --tokenizer PATH [flags]", {},
               "mxserve bench --base-url http://127.0.0.1:8000 --tokenizer models/tiny-glm-trained --sweep 1,2,4",
               {}, /*own_help=*/true});
  t.push_back({"bench-model", "time one attention and one MoE layer + the decode step (eager and CUDA-graph) on a backend",
               "--config FILE --synthetic-weights [flags]",
               {
                   {"--config", "FILE", "", "a config.json"},
                   {"--synthetic-weights", "", "", "required: synthetic weights"},
                   {"--backend", "cpu|cuda", "cpu", "cuda for meaningful numbers; cpu: a smoke test on tiny configs"},
                   {"--num-layers", "N", "all", "truncate the model (e.g. 2: layer 0 dense, layer 1 MoE)"},
                   {"--quantization", "EXPERTS[:REST]", "bf16", "synthetic precision plan"},
                   {"--seed", "N", "0", "synthetic weight seed"},
                   {"--batches", "LIST", "1,8,32,64", "decode batch sizes"},
                   {"--contexts", "LIST", "2048,8192", "decode context lengths"},
                   {"--prefill", "LIST", "1024,8192,20480", "prefill chunk sizes"},
                   {"--model-batches", "LIST", "1,8", "full decode-step batches (step context: the first of --contexts)"},
                   {"--block-size", "N", "16", "KV block size"},
                   {"--kv-cache-dtype", "auto|fp8_e4m3", "auto", "KV element type"},
                   {"--moe-activation-dtype", "bf16|fp8_e4m3", "bf16", "MXFP4 experts' prefill activations"},
                   {"--disable-cascade-attention", "", "", "no shared-prefix decode attention (cuda)"},
                   {"--shared-prefix", "TOKENS", "0", "model decode step: sequences share this prefix (whole blocks)"},
                   {"--prefix-group", "N", "4", "model decode step: sequences per shared prefix"},
                   {"--cuda-graph", "", "on with --backend cuda",
                    "add a 'decode step (graph)' row: the step replayed through the engine's decode graphs (cuda only)"},
                   {"--disable-cuda-graph", "", "", "the eager decode-step row only (sglang spelling)"},
                   {"--enforce-eager", "", "", "the eager decode-step row only (vLLM spelling)"},
                   {"--md", "FILE", "", "write the results as markdown"},
                   {"--json", "FILE", "", "write the results as JSON"},
               },
               "mxserve bench-model --config models/tiny-glm-trained/config.json --synthetic-weights --backend cpu "
               "--batches 1 --contexts 64 --prefill 32 --model-batches 1"});
  t.push_back({"bench-scheduler", "time the scheduler + KV bookkeeping per step (no model)", "[flags]",
               {
                   {"--running", "N", "256", "running requests"},
                   {"--blocks", "N", "100000", "KV blocks"},
                   {"--context", "N", "2000", "tokens per request"},
                   {"--steps", "N", "2000", "steps timed"},
               },
               "mxserve bench-scheduler --running 64 --steps 500"});
  t.push_back({"simulate", "the scheduler in virtual time under a step-cost model: TTFT / TPOT per rate, the knee (no model)",
               "[flags]",
               {
                   {"--input-len", "N", "20000", "prompt tokens per request"},
                   {"--output-len", "N", "1000", "generated tokens per request"},
                   {"--cache-hit-rate", "F", "0.6", "the shared prefix's share of each prompt"},
                   {"--num-prefix-groups", "N", "4", "prefix groups (request i in group i % N)"},
                   {"--rates", "LIST", "0.1,0.2,0.3,0.4,0.5", "offered req/s, constant arrivals"},
                   {"--num-requests", "N", "30", "measured requests a rate"},
                   {"--warmup", "N", "--num-prefix-groups", "requests before the measured ones (not counted)"},
                   {"--kv-tokens", "N", "341000", "KV pool in tokens (341000: 60 GiB of GLM-4.5-Air's bf16 cache)"},
                   {"--block-size", "N", "16", "tokens per KV block"},
                   {"--max-num-seqs", "N", "256", "running sequences at most"},
                   {"--max-num-batched-tokens", "N", "8192", "tokens a step"},
                   {"--chunked-prefill-size", "N", "8192", "prefill tokens a step"},
                   {"--max-itl-ms", "MS", "50", "ITL target of steps with decodes (0: off), as serve"},
                   {"--min-prefill-chunk", "N", "256", "prefill tokens a step with decodes always gets"},
                   {"--slo-ttft-ms", "MS", "0", "TTFT target of the prefill order (0: FCFS), as serve"},
                   {"--slo-ttft-over-itl", "", "", "a prefill that meets its TTFT deadline only past the ITL bound takes the bigger chunk, as serve"},
                   {"--no-enable-prefix-caching", "", "", "no prefix cache"},
                   {"--step-cost", "B,T,P,R,K", "0.0266,190e-6,6.87e-9,210e-6,0",
                    "seconds a step: base + per prefill token + per attention pair + per decode row + per decode KV "
                    "token (default: GLM-4.5-Air on one H200 as the engine fitted it; serve logs its own fit, 'step cost model ...', and /metrics has it)"},
                   {"--ttft-knee-ms", "MS", "5000", "the knee's TTFT p95 bound"},
                   {"--fit-step-log", "FILE", "", "instead of simulating: fit the step cost model to a `serve --step-log` "
                                                  "file, print the online and batch fits, their errors per kind of step "
                                                  "and the --step-cost to simulate with"},
               },
               "mxserve simulate --rates 0.2,0.3,0.4 --max-itl-ms 0\n"
               "mxserve simulate --fit-step-log steps.jsonl"});
  t.push_back({"tune-moe", "tune the MXFP4 MoE kernel choice per token count, write a table (CUDA)",
               "--experts E --hidden H --inter I --top-k K --out FILE [flags]",
               {
                   {"--experts", "E", "", "routed experts"},
                   {"--hidden", "H", "", "hidden size (multiple of 32)"},
                   {"--inter", "I", "", "expert intermediate size (multiple of 32)"},
                   {"--top-k", "K", "", "experts per token"},
                   {"--dtype", "mxfp4", "mxfp4", "expert weight type"},
                   {"--m", "LIST", "1,2,4,...,16384", "token counts tuned"},
                   {"--out", "FILE", "", "the table written (configs/moe/)"},
               },
               "mxserve tune-moe --experts 128 --hidden 4096 --inter 1408 --top-k 8 --out moe.json"});
  t.push_back({"tune-attention", "tune the decode attention split count per (rows, context), write a table (CUDA)",
               "--out FILE [flags]",
               {
                   {"--heads", "N", "96", "query heads"},
                   {"--kv-heads", "N", "8", "KV heads"},
                   {"--head-dim", "N", "128", "head dimension"},
                   {"--kv-cache-dtype", "bf16|fp8_e4m3", "bf16", "KV element type"},
                   {"--rows", "LIST", "1,2,4,...,256", "decode rows per cell"},
                   {"--contexts", "LIST", "1024,...,131072", "context lengths per cell"},
                   {"--max-rows", "N", "", "drop grid rows above N"},
                   {"--max-context", "N", "", "drop grid contexts above N"},
                   {"--pool-gib", "G", "16", "KV pool the blocks are scattered over"},
                   {"--out", "FILE", "", "the table written (configs/attention/)"},
                   {"--mla", "", "", "tune the Hopper absorbed-MLA attend kernel instead (--heads <= 64 per rank)"},
               },
               "mxserve tune-attention --kv-cache-dtype bf16 --out attention.json"});
  t.push_back({"bench-grammar", "structured output: token-mask cost per step at a batch", "--tokenizer DIR [flags]",
               {
                   {"--tokenizer", "DIR", "", "the tokenizer directory"},
                   {"--batch", "B", "64", "requests masked per step"},
                   {"--steps", "N", "200", "steps timed"},
                   {"--schema", "FILE", "a built-in schema", "a JSON schema"},
                   {"--doc", "FILE", "a built-in document", "a JSON document the schema accepts (teacher-forced)"},
                   {"--vocab-size", "V", "the tokenizer's", "vocabulary size of the mask"},
               },
               "mxserve bench-grammar --tokenizer models/tiny-glm-trained --batch 8 --steps 20"});
  t.push_back({"bench-kernels", "MoE kernel microbenchmark (CUDA)",
               "moe --experts E --hidden H --inter I --top-k K [flags]",
               {
                   {"--experts", "E", "", "routed experts"},
                   {"--hidden", "H", "", "hidden size (multiple of 32)"},
                   {"--inter", "I", "", "expert intermediate size (multiple of 32)"},
                   {"--top-k", "K", "", "experts per token"},
                   {"--m", "LIST", "1,2,4,...,16384", "token counts"},
                   {"--table", "FILE", "", "a tune-moe table to compare"},
                   {"--md", "FILE", "", "write the results as markdown"},
                   {"--probe", "", "", "also time every kernel variant"},
               },
               "mxserve bench-kernels moe --experts 128 --hidden 4096 --inter 1408 --top-k 8"});
  // eval subcommands
  t.push_back({"eval perplexity", "sliding-window perplexity of a model on a text file",
               "--model DIR --text FILE [flags]",
               {
                   {"--model", "DIR", "", "checkpoint directory"},
                   {"--text", "FILE", "", "UTF-8 text, tokenized with the model's tokenizer"},
                   {"--tokenizer", "DIR", "the --model directory", "tokenizer directory"},
                   {"--backend", "cpu|cuda", "cpu", "where the model runs"},
                   {"--window", "W", "min(1024, max_position_embeddings)", "tokens per window"},
                   {"--stride", "S", "W/2", "window step"},
                   {"--max-tokens", "N", "all", "score the first N tokens of the text"},
                   {"--quantization", "SCHEME", "none", "quantize on the fly (mxfp4, fp8-block, ...)"},
                   {"--kv-cache-dtype", "auto|bf16|fp8_e4m3|fp8", "auto", "KV element type"},
                   {"--json", "FILE", "", "write the result as JSON"},
               },
               "mxserve eval perplexity --model models/tiny-glm-trained --text README.md --max-tokens 256"});
  t.push_back({"eval compare", "KL / top-1 / perplexity of model B (or a precision, KV dtype, backend) against A",
               "--model DIR (--text FILE | --random-tokens N) [flags]",
               {
                   {"--model", "DIR", "", "model A (a config.json with --synthetic-weights)"},
                   {"--model-b", "DIR", "--model", "model B"},
                   {"--text", "FILE", "", "UTF-8 text"},
                   {"--random-tokens", "N", "", "N random tokens instead of --text"},
                   {"--tokenizer", "DIR", "the --model directory", "tokenizer directory"},
                   {"--backend", "cpu|cuda", "cpu", "A's backend"},
                   {"--backend-b", "cpu|cuda", "--backend", "B's backend"},
                   {"--window", "W", "min(1024, max_position_embeddings)", "tokens per window"},
                   {"--max-tokens", "N", "all", "score the first N tokens"},
                   {"--quantization", "SCHEME", "none", "B quantized on the fly"},
                   {"--kv-cache-dtype", "auto|bf16|fp8_e4m3|fp8", "auto", "B's KV element type"},
                   {"--synthetic-weights", "", "", "--model is a config.json: random weights"},
                   {"--num-layers", "N", "all", "layers kept (synthetic weights)"},
                   {"--json", "FILE", "", "write the result as JSON"},
               },
               "mxserve eval compare --model models/tiny-glm-trained --text README.md --quantization mxfp4 "
               "--max-tokens 256"});
  t.push_back({"eval acceptance", "MTP draft acceptance length on real text",
               "--model DIR --text FILE --speculative-num-steps N [flags]",
               cat({
                   {"--model", "DIR", "", "checkpoint directory with an MTP layer"},
                   {"--text", "FILE", "", "UTF-8 text the prompts are cut from"},
                   {"--tokenizer", "DIR", "the --model directory", "tokenizer directory"},
                   {"--backend", "cpu|cuda", "cpu", "where the model runs"},
                   {"--prompts", "P", "8", "prompts"},
                   {"--prompt-len", "L", "128", "tokens per prompt"},
                   {"--gen-tokens", "G", "128", "tokens generated per prompt"},
                   {"--json", "FILE", "", "write the result as JSON"},
               }, spec_flags()),
               "mxserve eval acceptance --model models/tiny-glm-trained --text README.md --speculative-num-steps 2 "
               "--prompts 2 --prompt-len 16 --gen-tokens 8"});
  t.push_back({"eval tasks", "accuracy of any OpenAI-compatible server on a task file",
               "--base-url URL --data FILE.jsonl --task gsm8k|multiple-choice [flags]",
               {
                   {"--base-url", "URL", "", "the server, e.g. http://127.0.0.1:8000"},
                   {"--data", "FILE", "", "task items (JSON lines)"},
                   {"--task", "gsm8k|multiple-choice", "", "how items are asked and scored"},
                   {"--model", "NAME", "the server's only model", "the model id sent"},
                   {"--api-key", "KEY", "", "Bearer token"},
                   {"--concurrency", "C", "8", "requests in flight"},
                   {"--max-tokens", "N", "512 (gsm8k), 64", "tokens per answer"},
                   {"--temperature", "T", "0", "sampling temperature"},
                   {"--timeout", "S", "600", "seconds per request"},
                   {"--limit", "N", "all", "first N items"},
                   {"--output", "FILE", "", "per-item results (JSON lines)"},
                   {"--json", "FILE", "", "write the summary as JSON"},
                   {"--no-progress", "", "", "no progress line"},
               },
               "mxserve eval tasks --base-url http://127.0.0.1:8000 --data tasks.jsonl --task multiple-choice"});
  return t;
}

}  // namespace

const std::vector<CommandHelp>& command_table() {
  static const std::vector<CommandHelp> t = build_table();
  return t;
}

const CommandHelp* find_command_help(const std::string& name) {
  for (const auto& c : command_table())
    if (c.name == name) return &c;
  return nullptr;
}

void print_usage(FILE* out) {
  std::fprintf(out, "usage: mxserve <command> [flags]      (mxserve <command> --help: its flags, defaults, an example)\n"
                    "       mxserve help <command> | --version\n\ncommands:\n");
  for (const auto& c : command_table())
    if (c.name.find(' ') == std::string::npos) std::fprintf(out, "  %-16s %s\n", c.name.c_str(), c.summary.c_str());
}

void print_command_help(const CommandHelp& c, FILE* out) {
  std::fprintf(out, "mxserve %s: %s\n\nusage: mxserve %s %s\n", c.name.c_str(), c.summary.c_str(), c.name.c_str(),
               c.usage.c_str());
  if (!c.subcommands.empty()) {
    std::fprintf(out, "\nsubcommands (mxserve %s SUBCOMMAND --help for its flags):\n", c.name.c_str());
    for (const auto& s : c.subcommands) {
      const CommandHelp* sub = find_command_help(c.name + " " + s);
      std::fprintf(out, "  %-12s %s\n", s.c_str(), sub ? sub->summary.c_str() : "");
    }
  }
  std::fprintf(out, "\nflags:\n");
  size_t width = 0;
  for (const auto& f : c.flags)
    if (!f.flag.empty()) width = std::max(width, f.flag.size() + (f.value.empty() ? 0 : f.value.size() + 1));
  width = std::max<size_t>(std::min<size_t>(width, 30), 10);
  for (const auto& f : c.flags) {
    if (f.flag.empty()) {
      std::fprintf(out, " %s:\n", f.help.c_str());
      continue;
    }
    const std::string left = f.flag + (f.value.empty() ? "" : " " + f.value);
    std::string line = "  " + left;
    if (left.size() > width) line += "\n  " + std::string(width, ' ');
    else line += std::string(width - left.size(), ' ');
    line += "  " + f.help;
    if (!f.def.empty()) line += " (default: " + f.def + ")";
    std::fprintf(out, "%s\n", line.c_str());
  }
  std::fprintf(out, "  --help, -h%s  this text\n", std::string(width - 10, ' ').c_str());
  if (!c.example.empty()) {
    std::fprintf(out, "\nexample:\n");
    size_t pos = 0;
    while (pos < c.example.size()) {
      const size_t nl = c.example.find('\n', pos);
      std::fprintf(out, "  %s\n", c.example.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos).c_str());
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
  }
}

namespace {
std::string& current() {
  static std::string name;
  return name;
}
}  // namespace

void set_current_command(const std::string& name) { current() = name; }
const std::string& current_command() { return current(); }

}  // namespace mxserve::cli
