import type { FastifyInstance } from "fastify";
import { z } from "zod";
import type { PauseMode } from "../engine.js";
import type { SimState } from "../state.js";
import { vllmHas } from "../versions.js";

/**
 * vLLM's RLHF / dev-mode control routes (`vllm/entrypoints/serve/rlhf/api_router.py`, the version
 * with `mode=`; gated by VLLM_SERVER_DEV_MODE=1 on real servers ≥ ~v0.16, always on here). Below the
 * release that added `mode` (versions.ts), the parameter is ignored: a pause aborts, or waits with
 * the old `wait_for_inflight_requests=true`.
 *   POST /pause?mode=abort|wait|keep[&clear_cache=true]  → {"status":"paused"}; 400 {"error": "..."} on a bad mode.
 *     abort: in-flight requests end now with finish_reason "abort" (partial tokens kept);
 *     wait: returns once in-flight requests have finished; keep: freezes them until /resume.
 *     New requests are held until /resume in every mode. abort/wait clear the prefix cache unless clear_cache=false.
 *     The deprecated `wait_for_inflight_requests=true` means mode=wait.
 *   POST /resume → {"status":"resumed"};  GET /is_paused → {"is_paused": bool}
 *   GET /weight_info → {"weight_version": v};  POST /update_weight_version {"new_version"} → {"success":true,"new_version":v}
 *   POST /reset_prefix_cache → 200, empty body.
 */

const MODES = new Set(["abort", "wait", "keep"]);
const UpdateWeightVersion = z.object({ new_version: z.string() });

export function registerVllmControlRoutes(app: FastifyInstance, sim: SimState): void {
  app.post("/pause", async (req, reply) => {
    const q = req.query as Record<string, string | undefined>;
    const modes = vllmHas(sim.opts.vllmVersion, "pauseModes");
    let mode = (modes ? q.mode : undefined) ?? "abort";
    if ((!modes || q.mode === undefined) && q.wait_for_inflight_requests === "true") mode = "wait";
    if (!MODES.has(mode)) return reply.code(400).send({ error: `Invalid pause mode: ${mode}. Expected one of 'abort', 'wait', 'keep'.` });
    await sim.engine.pause(mode as PauseMode);
    if (mode !== "keep" && q.clear_cache !== "false") for (const r of sim.ranks.ranks) r.cache.clear();
    return { status: "paused" };
  });
  app.post("/resume", async () => {
    sim.engine.resume();
    return { status: "resumed" };
  });
  app.get("/is_paused", async () => ({ is_paused: sim.engine.paused }));
  app.get("/weight_info", async () => ({ weight_version: sim.weightVersion }));
  app.post("/update_weight_version", async (req, reply) => {
    const parsed = UpdateWeightVersion.safeParse(req.body);
    if (!parsed.success) return reply.code(422).send({ detail: parsed.error.issues.map((i) => ({ loc: ["body", ...i.path], msg: i.message, type: "value_error" })) });
    sim.weightVersion = parsed.data.new_version;
    return { success: true, new_version: sim.weightVersion };
  });
  app.post("/reset_prefix_cache", async (_req, reply) => {
    for (const r of sim.ranks.ranks) r.cache.clear();
    return reply.code(200).send("");
  });
}
