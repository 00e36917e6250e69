import type { EngineConfig } from "@rollgate/protocol";
import { request, type Dispatcher } from "undici";

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
 * The engines' own pause routes: vLLM `POST /pause?mode=abort|wait` and `/resume` (dev mode on
 * newer vLLM), SGLang `POST /pause_generation {mode}` and `/continue_generation`. The gateway
 * pauses them after its own drain, so `mode` only matters for what is still running then.
 */
export async function pauseEngine(dispatcher: Dispatcher, e: EngineConfig, abort: boolean): Promise<EngineControlResult> {
  const r =
    e.kind === "vllm"
      ? await call(dispatcher, e.url, `/pause?mode=${abort ? "abort" : "wait"}`)
      : await call(dispatcher, e.url, "/pause_generation", { mode: abort ? "abort" : "in_place" });
  return { url: e.url, kind: e.kind, ok: r.status === 200, status: r.status, detail: r.text };
}

export async function resumeEngine(dispatcher: Dispatcher, e: EngineConfig): Promise<EngineControlResult> {
  const r = e.kind === "vllm" ? await call(dispatcher, e.url, "/resume") : await call(dispatcher, e.url, "/continue_generation");
  return { url: e.url, kind: e.kind, ok: r.status === 200, status: r.status, detail: r.text };
}

/**
 * One health probe of one rank: a one-token generation pinned to the rank (a whole-server
 * `/health` cannot tell which data-parallel rank is sick).
 */
export async function probeRank(dispatcher: Dispatcher, e: EngineConfig, model: string, dpRank: number): Promise<{ ok: boolean; latencyMs: number; detail: string }> {
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
    return { ok: res.statusCode === 200, latencyMs: Date.now() - started, detail: res.statusCode === 200 ? "ok" : `${res.statusCode}: ${text.slice(0, 200)}` };
  } catch (err) {
    return { ok: false, latencyMs: Date.now() - started, detail: (err as Error).message };
  }
}
