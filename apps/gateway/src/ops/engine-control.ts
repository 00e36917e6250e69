import { request, type Dispatcher } from "undici";
import type { EngineConfig } from "../env.js";

export interface EngineControlResult {
  url: string;
  kind: EngineConfig["kind"];
  ok: boolean;
  status: number | null;
  detail: string;
}

async function call(dispatcher: Dispatcher, url: string, path: string, body?: unknown): Promise<{ status: number | null; text: string }> {
  try {
    const res = await request(`${url}${path}`, {
      method: "POST",
      dispatcher,
      headers: body === undefined ? {} : { "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      headersTimeout: 30_000,
      bodyTimeout: 30_000,
    });
    return { status: res.statusCode, text: (await res.body.text()).slice(0, 500) };
  } catch (err) {
    return { status: null, text: (err as Error).message };
  }
}

/**
 * How an engine's own pause route treats what is still running: cut it (`abort`), let it finish
 * (`finish`: vLLM `wait`; SGLang has no such mode, and the gateway only asks after its own drain, so
 * `in_place` holds nothing), or freeze it until resume (`freeze`: vLLM `keep`, SGLang `in_place`).
 */
export type EnginePauseMode = "abort" | "finish" | "freeze";

/**
 * The engines' own pause routes: vLLM `POST /pause?mode=abort|wait|keep` and `/resume` (dev mode on
 * newer vLLM), SGLang `POST /pause_generation {mode: abort|in_place}` and `/continue_generation`.
 */
export async function pauseEngine(dispatcher: Dispatcher, e: EngineConfig, mode: EnginePauseMode): Promise<EngineControlResult & { mode: string }> {
  const engineMode = e.kind === "vllm" ? { abort: "abort", finish: "wait", freeze: "keep" }[mode] : { abort: "abort", finish: "in_place", freeze: "in_place" }[mode];
  // vLLM before pause modes (< 0.16) ignores `mode` and aborts unless asked to wait with
  // `wait_for_inflight_requests` (deprecated since, and the same as mode=wait where both are read).
  const query = mode === "finish" ? `mode=${engineMode}&wait_for_inflight_requests=true` : `mode=${engineMode}`;
  const r =
    e.kind === "vllm"
      ? await call(dispatcher, e.url, `/pause?${query}`)
      : await call(dispatcher, e.url, "/pause_generation", { mode: engineMode });
  return { url: e.url, kind: e.kind, mode: engineMode, ok: r.status === 200, status: r.status, detail: r.text };
}

export async function resumeEngine(dispatcher: Dispatcher, e: EngineConfig): Promise<EngineControlResult> {
  const r = e.kind === "vllm" ? await call(dispatcher, e.url, "/resume") : await call(dispatcher, e.url, "/continue_generation");
  return { url: e.url, kind: e.kind, ok: r.status === 200, status: r.status, detail: r.text };
}

/**
 * One health probe of one rank: a one-token generation pinned to the rank (a whole-server
 * `/health` cannot tell which data-parallel rank is sick).
 */
export async function probeRank(dispatcher: Dispatcher, e: EngineConfig, model: string, dpRank: number): Promise<{ ok: boolean; reachable: boolean; latencyMs: number; detail: string }> {
  const started = Date.now();
  try {
    const res = await request(`${e.url}/v1/chat/completions`, {
      method: "POST",
      dispatcher,
      headers: { "content-type": "application/json", "x-data-parallel-rank": String(dpRank) },
      body: JSON.stringify({
        model,
        messages: [{ role: "user", content: "ping" }],
        max_tokens: 1,
        ...(e.kind === "sglang" ? { routed_dp_rank: dpRank } : {}),
      }),
      headersTimeout: 10_000,
      bodyTimeout: 10_000,
    });
    const text = await res.body.text();
    return { ok: res.statusCode === 200, reachable: true, latencyMs: Date.now() - started, detail: res.statusCode === 200 ? "ok" : `${res.statusCode}: ${text.slice(0, 200)}` };
  } catch (err) {
    // No HTTP answer at all (refused, reset, timed out): the engine may be down or restarting.
    return { ok: false, reachable: false, latencyMs: Date.now() - started, detail: (err as Error).message };
  }
}
