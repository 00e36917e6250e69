import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { sglangError, vllmError } from "../errors.js";
import type { SimState } from "../state.js";
import { formatZodError } from "./common.js";

/**
 * Loading new weights, each kind through its own server's routes. Any successful load changes the
 * weight version (and with it every later logprob): to the version the request names, else the
 * next one (sim choice: a real vLLM keeps `/weight_info` until `/update_weight_version`, a real
 * SGLang keeps its version unless one is given; the sim serves one policy, so new weights always
 * mean new logprobs). A failed load changes no rank (SGLang rolls a failing rank back; the sim
 * keeps every rank on the old weights).
 *
 * vLLM (dev mode, VLLM_SERVER_DEV_MODE=1; `serve/dev/rpc/api_router.py` and
 * `serve/lora/api_router.py` of vLLM main, 2026):
 *   POST /collective_rpc {method, args?, kwargs?, timeout?} → {"results": [...]}, one entry per worker
 *     of the first DP engine (one here: TP 1); a worker error fails the whole call with 500.
 *     method "update_config", args [{"model_config": {"model": path}, "load_config"?: {…}}]:
 *       where the next reload reads from (the workers' `update_config`, vLLM PR #20095);
 *     method "reload_weights": every DP rank reloads from the model path;
 *     any other method: 500 (the worker has no such method).
 *   POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace?} → 200 text; 400 when the name is
 *     loaded and `load_inplace` is not set (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True on a real server).
 *   POST /v1/unload_lora_adapter {lora_name} → 200 text; 404 when it is not loaded.
 * SGLang (v0.5.x `http_server.py`, `tokenizer_manager.py`):
 *   POST /update_weights_from_disk {model_path, load_format?, weight_version?, abort_all_requests?}
 *     → {success, message, num_paused_requests}, 200 or 400; with dp_size > 1 the message is the
 *     ranks' own messages joined by " | " (FanOutCommunicator.merge_results), and a given
 *     weight_version appends " Weight version updated to <v>." on success.
 *   POST /load_lora_adapter {lora_name, lora_path, pinned?} and POST /unload_lora_adapter {lora_name}
 *     → {success, error_message, loaded_adapters}, 200 or 400.
 * Sim-only (both kinds):
 *   POST /sim/load_faults {rank?, message?, clear?} → {"load_faults": [{rank, message}]}: the rank (no
 *     rank: every rank) fails every load from now on with `message`, until cleared; GET /sim/load_faults.
 *   POST /sim/load_delay {ms} → {"load_delay_ms": ms}: every weight load (vLLM `reload_weights`, SGLang
 *     `/update_weights_from_disk`) takes `ms` before it answers, as a real checkpoint load takes minutes.
 */

const CollectiveRpc = z.object({
  method: z.string().min(1),
  args: z.array(z.unknown()).default([]),
  kwargs: z.record(z.string(), z.unknown()).default({}),
  timeout: z.number().nullish(),
});
const ConfigOverrides = z.object({
  model_config: z.object({ model: z.string().min(1) }).passthrough().optional(),
  load_config: z.record(z.string(), z.unknown()).optional(),
});
const VllmLoadLora = z.object({ lora_name: z.string().min(1), lora_path: z.string().min(1), load_inplace: z.boolean().default(false) });
const VllmUnloadLora = z.object({ lora_name: z.string().min(1), lora_int_id: z.number().int().nullish() });
const SglangFromDisk = z.object({
  model_path: z.string(),
  load_format: z.string().nullish(),
  weight_version: z.string().nullish(),
  abort_all_requests: z.boolean().nullish(),
});
const SglangLoadLora = z.object({ lora_name: z.string().min(1), lora_path: z.string().min(1), pinned: z.boolean().nullish() });
const SglangUnloadLora = z.object({ lora_name: z.string().min(1) });
const LoadDelay = z.object({ ms: z.number().int().nonnegative().max(600_000) });
const LoadFault = z.object({ rank: z.number().int().nonnegative().nullish(), message: z.string().min(1).nullish(), clear: z.boolean().nullish() });

const SGLANG_OK = "Succeeded to update model weights.";

export function registerWeightRoutes(app: FastifyInstance, sim: SimState): void {
  /** rank → why its loads fail (sim-only fault). */
  const loadFaults = new Map<number, string>();
  /** Loaded LoRA adapters by name. */
  const adapters = new Map<string, { path: string; pinned: boolean }>();
  let modelPath = sim.opts.model;
  /** How long each weight load takes (sim-only). */
  let loadDelayMs = 0;
  const loading = () => (loadDelayMs > 0 ? new Promise((r) => setTimeout(r, loadDelayMs)) : Promise.resolve());

  const failing = () => sim.ranks.ranks.filter((r) => loadFaults.has(r.index));
  const faultList = () => ({ load_faults: [...loadFaults].sort(([a], [b]) => a - b).map(([rank, message]) => ({ rank, message })) });
  const newWeights = (version?: string | null) => {
    sim.weightVersion = version ?? sim.nextWeightVersion();
  };

  app.post("/sim/load_delay", async (req, reply) => {
    const parsed = LoadDelay.safeParse(req.body ?? {});
    if (!parsed.success) return reply.code(400).send({ error: formatZodError(parsed.error) });
    loadDelayMs = parsed.data.ms;
    return { load_delay_ms: loadDelayMs };
  });
  app.get("/sim/load_faults", async () => faultList());
  app.post("/sim/load_faults", async (req, reply) => {
    const parsed = LoadFault.safeParse(req.body ?? {});
    if (!parsed.success) return reply.code(400).send({ error: formatZodError(parsed.error) });
    const { rank, message, clear } = parsed.data;
    if (rank !== null && rank !== undefined && rank >= sim.ranks.size) return reply.code(400).send({ error: `rank ${rank} is out of range [0, ${sim.ranks.size})` });
    const ranks = rank === null || rank === undefined ? sim.ranks.ranks.map((r) => r.index) : [rank];
    for (const r of ranks) {
      if (clear) loadFaults.delete(r);
      else loadFaults.set(r, message ?? "injected load failure");
    }
    return faultList();
  });

  if (sim.opts.kind === "vllm") {
    app.post("/collective_rpc", async (req, reply) => {
      const parsed = CollectiveRpc.safeParse(req.body);
      if (!parsed.success) return reply.code(400).send({ detail: parsed.error.issues.some((i) => i.path[0] === "method") ? "Missing 'method' in request body" : formatZodError(parsed.error) });
      const { method, args } = parsed.data;
      const fail = (why: string) =>
        reply
          .code(500)
          .send(vllmError(`Call to collective_rpc method failed: Worker failed with error '${why}', please check the stack trace above for the root cause`, 500));
      if (method === "update_config") {
        const overrides = ConfigOverrides.safeParse(args[0]);
        if (!overrides.success) return fail(`update_config: ${formatZodError(overrides.error)}`);
        if (overrides.data.model_config) modelPath = overrides.data.model_config.model;
        return { results: [null] };
      }
      if (method === "reload_weights") {
        await loading();
        const bad = failing();
        if (bad.length > 0) return fail(bad.map((r) => `dp rank ${r.index}: ${loadFaults.get(r.index)} (loading ${modelPath})`).join("; "));
        newWeights();
        return { results: [null] };
      }
      return fail(`AttributeError: 'Worker' object has no attribute '${method}'`);
    });

    app.post("/v1/load_lora_adapter", async (req, reply) => {
      const parsed = VllmLoadLora.safeParse(req.body);
      if (!parsed.success) return reply.code(400).send(vllmError(formatZodError(parsed.error), 400));
      const { lora_name, lora_path, load_inplace } = parsed.data;
      if (adapters.has(lora_name) && !load_inplace) {
        return reply
          .code(400)
          .send(vllmError(`The lora adapter '${lora_name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.`, 400));
      }
      const bad = failing();
      if (bad.length > 0) return reply.code(400).send(vllmError(`Failed to load LoRA adapter '${lora_name}' from ${lora_path}: ${bad.map((r) => `dp rank ${r.index}: ${loadFaults.get(r.index)}`).join("; ")}`, 400));
      adapters.set(lora_name, { path: lora_path, pinned: false });
      newWeights();
      return reply.code(200).type("text/plain; charset=utf-8").send(`Success: LoRA adapter '${lora_name}' added successfully.`);
    });
    app.post("/v1/unload_lora_adapter", async (req, reply) => {
      const parsed = VllmUnloadLora.safeParse(req.body);
      if (!parsed.success) return reply.code(400).send(vllmError(formatZodError(parsed.error), 400));
      const { lora_name } = parsed.data;
      if (!adapters.delete(lora_name)) return reply.code(404).send(vllmError(`The lora adapter '${lora_name}' cannot be found.`, 404));
      return reply.code(200).type("text/plain; charset=utf-8").send(`Success: LoRA adapter '${lora_name}' removed successfully.`);
    });
    return;
  }

  app.post("/update_weights_from_disk", async (req, reply) => {
    const parsed = SglangFromDisk.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    const { model_path, weight_version, abort_all_requests } = parsed.data;
    if (abort_all_requests) for (const g of [...sim.engine.active]) sim.engine.stop(g, "abort");
    await loading();
    // One message per DP rank, in rank order, as the tokenizer manager joins them.
    const perRank = sim.ranks.ranks.map((r) => {
      const why = loadFaults.get(r.index);
      return why === undefined ? SGLANG_OK : `Failed to update weights: ${why} (loading ${model_path}).\nRolling back to original weights.`;
    });
    const success = failing().length === 0;
    let message = perRank.join(" | ");
    if (success) {
      newWeights(weight_version);
      modelPath = model_path;
      if (weight_version !== null && weight_version !== undefined) message += ` Weight version updated to ${weight_version}.`;
    }
    const paused = sim.ranks.size === 1 ? 0 : sim.ranks.ranks.map(() => 0);
    return reply.code(success ? 200 : 400).send({ success, message, num_paused_requests: paused });
  });

  const loraAnswer = (success: boolean, error: string | null) => ({
    success,
    error_message: error,
    loaded_adapters: Object.fromEntries([...adapters].map(([name, a]) => [name, { lora_name: name, lora_path: a.path, pinned: a.pinned }])),
  });
  app.post("/load_lora_adapter", async (req, reply) => {
    const parsed = SglangLoadLora.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    const { lora_name, lora_path, pinned } = parsed.data;
    if (adapters.has(lora_name)) return reply.code(400).send(loraAnswer(false, `The LoRA adapter with name '${lora_name}' is already loaded.`));
    const bad = failing();
    if (bad.length > 0) return reply.code(400).send(loraAnswer(false, bad.map((r) => `dp rank ${r.index}: ${loadFaults.get(r.index)} (loading ${lora_path})`).join(" | ")));
    adapters.set(lora_name, { path: lora_path, pinned: pinned ?? false });
    newWeights();
    return loraAnswer(true, null);
  });
  app.post("/unload_lora_adapter", async (req, reply) => {
    const parsed = SglangUnloadLora.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send(sglangError(formatZodError(parsed.error)));
    const { lora_name } = parsed.data;
    if (!adapters.delete(lora_name)) return reply.code(400).send(loraAnswer(false, `The LoRA adapter with name '${lora_name}' is not loaded.`));
    return loraAnswer(true, null);
  });
}
