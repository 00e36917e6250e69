import { request, type Dispatcher } from "undici";
import { z } from "zod";
import type { EngineConfig } from "../env.js";

/** What to load: a checkpoint folder every engine can read, or a LoRA adapter (loaded or replaced under `name`). */
export const WeightLoad = z.union([
  z.object({ path: z.string().min(1).max(4096) }).strict(),
  z.object({ lora: z.object({ name: z.string().min(1).max(256), path: z.string().min(1).max(4096) }).strict() }).strict(),
]);
export type WeightLoad = z.infer<typeof WeightLoad>;

/** One HTTP call the load made to an engine. */
export interface LoadStep {
  route: string;
  status: number | null;
  /** The engine's answer (cut to 500 characters), or why the call failed. */
  detail: string;
}

export interface RankLoad {
  dp_rank: number;
  /** True only when the engine confirmed this rank runs the new weights. */
  loaded: boolean;
  detail: string;
}

export interface EngineLoad {
  index: number;
  kind: EngineConfig["kind"];
  url: string;
  ok: boolean;
  ranks: RankLoad[];
  steps: LoadStep[];
  /** The version the engine reports after the load (vLLM `/weight_info`, SGLang `/model_info`); null when it cannot say. */
  engine_weight_version: string | null;
}

/** Loading a model's weights can take minutes on a real engine. */
const LOAD_TIMEOUT_MS = 15 * 60_000;
const SMALL_TIMEOUT_MS = 30_000;

interface Answer {
  status: number | null;
  text: string;
}

async function call(dispatcher: Dispatcher, url: string, method: "GET" | "POST", path: string, body: unknown, timeoutMs: number): Promise<Answer> {
  try {
    const res = await request(`${url}${path}`, {
      method,
      dispatcher,
      headers: body === undefined ? {} : { "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    });
    return { status: res.statusCode, text: await res.body.text() };
  } catch (err) {
    return { status: null, text: `unreachable: ${(err as Error).message}` };
  }
}

function json(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** The message an engine put in its error envelope (vLLM `{error:{message}}`, FastAPI `{detail}`, SGLang `{error_message}`), else the text. */
function engineMessage(a: Answer): string {
  const body = json(a.text) as Record<string, unknown> | undefined;
  const err = body?.error;
  const message =
    (typeof err === "object" && err !== null && typeof (err as { message?: unknown }).message === "string" ? (err as { message: string }).message : undefined) ??
    (typeof err === "string" ? err : undefined) ??
    (typeof body?.error_message === "string" ? body.error_message : undefined) ??
    (typeof body?.message === "string" ? body.message : undefined) ??
    (typeof body?.detail === "string" ? body.detail : undefined);
  return (message ?? a.text).slice(0, 500) || (a.status === null ? "no answer" : `HTTP ${a.status}`);
}

const ok2xx = (a: Answer) => a.status !== null && a.status >= 200 && a.status < 300;

/** What a 404 from a weight route usually means: the engine was started without the switch that serves it. */
const NOT_SERVED: Record<string, string> = {
  "vllm /collective_rpc": "start vLLM with VLLM_SERVER_DEV_MODE=1",
  "vllm /v1/load_lora_adapter": "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
  "sglang /load_lora_adapter": "start SGLang with --enable-lora",
};

/**
 * Loads new weights on one engine through its own routes, while inference is paused, and says per
 * rank what loaded. Routes (real servers need their dev/admin switches):
 *  vLLM (VLLM_SERVER_DEV_MODE=1; `serve/dev/rpc` and `serve/dev/rlhf` of vLLM main, 2026):
 *    path: `POST /collective_rpc {method: "update_config", args: [{model_config: {model: path}}]}`
 *      (the workers' update_config, vLLM PR #20095), then `{method: "reload_weights"}` (every DP
 *      engine reloads; a worker error fails the call, naming it in the message);
 *    LoRA (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): `POST /v1/load_lora_adapter {lora_name,
 *      lora_path, load_inplace: true}` (replaces an adapter of that name in place);
 *    then `POST /reset_prefix_cache` (the cache holds the old weights' KV) and
 *    `POST /update_weight_version {new_version}`; `GET /weight_info` to read it back.
 *  SGLang (v0.5.x `http_server.py`):
 *    path: `POST /update_weights_from_disk {model_path, weight_version}` (it flushes its cache; with
 *      dp_size > 1 the message is each rank's own, joined by " | ", in rank order);
 *    LoRA: `POST /unload_lora_adapter {lora_name}` (a missing one is fine), then
 *      `POST /load_lora_adapter {lora_name, lora_path}`, `POST /flush_cache` and
 *      `POST /update_weight_version {new_version}`;
 *    `GET /model_info` to read the version back.
 */
export async function loadEngineWeights(dispatcher: Dispatcher, index: number, e: EngineConfig, load: WeightLoad, version: string): Promise<EngineLoad> {
  const steps: LoadStep[] = [];
  const step = async (method: "GET" | "POST", path: string, body?: unknown, timeoutMs = SMALL_TIMEOUT_MS, label = `${method} ${path}`): Promise<Answer> => {
    const a = await call(dispatcher, e.url, method, path, body, timeoutMs);
    const hint = a.status === 404 ? NOT_SERVED[`${e.kind} ${path}`] : undefined;
    if (hint) a.text = JSON.stringify({ error: { message: `${label} is not served by this engine (${hint})` } });
    steps.push({ route: label, status: a.status, detail: ok2xx(a) ? a.text.slice(0, 500) : engineMessage(a) });
    return a;
  };
  const ranks = (loaded: boolean, detail: string): RankLoad[] => Array.from({ length: e.dp_size }, (_, dp_rank) => ({ dp_rank, loaded, detail }));
  const done = (ok: boolean, rankLoads: RankLoad[], engineVersion: string | null): EngineLoad => ({
    index,
    kind: e.kind,
    url: e.url,
    ok,
    ranks: rankLoads,
    steps,
    engine_weight_version: engineVersion,
  });

  if (e.kind === "vllm") {
    let loaded: Answer;
    if ("path" in load) {
      const config = await step("POST", "/collective_rpc", { method: "update_config", args: [{ model_config: { model: load.path } }] }, SMALL_TIMEOUT_MS, "POST /collective_rpc update_config");
      if (!ok2xx(config)) return done(false, ranks(false, `update_config failed: ${engineMessage(config)}`), null);
      loaded = await step("POST", "/collective_rpc", { method: "reload_weights" }, LOAD_TIMEOUT_MS, "POST /collective_rpc reload_weights");
    } else {
      loaded = await step("POST", "/v1/load_lora_adapter", { lora_name: load.lora.name, lora_path: load.lora.path, load_inplace: true }, LOAD_TIMEOUT_MS);
    }
    // One call covers every DP rank of the engine: it either confirms them all or names the failure.
    if (!ok2xx(loaded)) return done(false, ranks(false, `not confirmed: the engine's load failed: ${engineMessage(loaded)}`), null);
    await step("POST", "/reset_prefix_cache");
    await step("POST", "/update_weight_version", { new_version: version });
    const info = json((await step("GET", "/weight_info")).text) as { weight_version?: unknown } | undefined;
    return done(true, ranks(true, "loaded"), typeof info?.weight_version === "string" ? info.weight_version : null);
  }

  let rankLoads: RankLoad[];
  let ok: boolean;
  if ("path" in load) {
    const a = await step("POST", "/update_weights_from_disk", { model_path: load.path, weight_version: version }, LOAD_TIMEOUT_MS);
    const body = json(a.text) as { success?: unknown; message?: unknown } | undefined;
    ok = ok2xx(a) && body?.success === true;
    const message = typeof body?.message === "string" ? body.message : engineMessage(a);
    const perRank = message.split(" | ");
    rankLoads =
      perRank.length === e.dp_size && typeof body?.success === "boolean"
        ? perRank.map((m, dp_rank) => ({ dp_rank, loaded: ok || m.startsWith("Succeeded"), detail: m.slice(0, 500) }))
        : ranks(ok, ok ? "loaded" : `not confirmed: ${message.slice(0, 500)}`);
  } else {
    const unloaded = ok2xx(await step("POST", "/unload_lora_adapter", { lora_name: load.lora.name }));
    const a = await step("POST", "/load_lora_adapter", { lora_name: load.lora.name, lora_path: load.lora.path }, LOAD_TIMEOUT_MS);
    ok = ok2xx(a) && (json(a.text) as { success?: unknown } | undefined)?.success === true;
    // SGLang has no in-place replace: the old adapter is gone once the unload answered.
    const gone = unloaded ? `; adapter '${load.lora.name}' was unloaded before the load failed: the engine serves no adapter under that name now` : "";
    rankLoads = ranks(ok, ok ? "loaded" : `not confirmed: the engine's load failed: ${engineMessage(a)}${gone}`);
    if (ok) {
      await step("POST", "/flush_cache");
      await step("POST", "/update_weight_version", { new_version: version });
    }
  }
  if (!ok) return done(false, rankLoads, null);
  const info = json((await step("GET", "/model_info")).text) as { weight_version?: unknown } | undefined;
  return done(true, rankLoads, typeof info?.weight_version === "string" ? info.weight_version : null);
}

/** One sentence per engine that did not load: which engine, which ranks, what it said. */
export function describeLoadFailures(loads: EngineLoad[]): string {
  return loads
    .filter((l) => !l.ok)
    .map((l) => {
      const failed = l.ranks.filter((r) => !r.loaded);
      const confirmed = l.ranks.filter((r) => r.loaded).map((r) => r.dp_rank);
      const why = [...new Set(failed.map((r) => r.detail))].join("; ");
      return `engine ${l.index} (${l.kind} ${l.url}): rank${failed.length === 1 ? "" : "s"} ${failed.map((r) => r.dp_rank).join(", ")} did not load (${why})${confirmed.length ? `; rank${confirmed.length === 1 ? "" : "s"} ${confirmed.join(", ")} did` : ""}`;
    })
    .join(". ");
}

/**
 * The ranks a load that failed elsewhere did confirm, one clause per engine ("engine 0 (vllm
 * URL): ranks 0, 1"), and the engines whose old LoRA adapter was unloaded by a load that then
 * failed; null when none. Those ranks now run weights the policy version does not
 * name (a rank that failed is taken to keep its old ones: SGLang rolls back, vLLM fails as one).
 */
export function describeLoadedRanks(loads: EngineLoad[], load: WeightLoad): string | null {
  const clauses = loads.flatMap((l) => {
    const loaded = l.ranks.filter((r) => r.loaded).map((r) => r.dp_rank);
    if (loaded.length) return [`engine ${l.index} (${l.kind} ${l.url}): rank${loaded.length === 1 ? "" : "s"} ${loaded.join(", ")}`];
    // An SGLang LoRA load unloads the old adapter first: failed after, the engine serves neither.
    const unload = l.steps.find((s) => s.route === "POST /unload_lora_adapter");
    const unloaded = unload?.status !== null && unload?.status !== undefined && unload.status >= 200 && unload.status < 300;
    return !l.ok && unloaded && "lora" in load ? [`engine ${l.index} (${l.kind} ${l.url}): adapter '${load.lora.name}' unloaded`] : [];
  });
  return clauses.length ? clauses.join("; ") : null;
}

/** The weight version an engine reports as its own now (vLLM `/weight_info`, SGLang `/model_info`); null when it cannot say. */
export async function engineWeightVersion(dispatcher: Dispatcher, e: EngineConfig): Promise<string | null> {
  const a = await call(dispatcher, e.url, "GET", e.kind === "vllm" ? "/weight_info" : "/model_info", undefined, SMALL_TIMEOUT_MS);
  if (!ok2xx(a)) return null;
  const info = json(a.text) as { weight_version?: unknown } | undefined;
  return typeof info?.weight_version === "string" ? info.weight_version : null;
}
