import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { FaultSpec, faultJson } from "../faults.js";
import type { SimState } from "../state.js";
import { formatZodError } from "./common.js";

/**
 * Sim-only admin routes (both kinds; never on a real server):
 *   GET  /sim/stats   the served family, parsers, vocab_size and simulated vLLM version; per-rank counters
 *                     (served, client_closed: admitted requests whose client went away, running, waiting,
 *                     cached blocks, fault), pause state, weight version, `tokenize_requests` (/tokenize calls)
 *   GET  /sim/faults  {"faults": [{rank, mode, error_rate, delay_ms, after_tokens}, …]}
 *   POST /sim/faults  {rank?, mode, error_rate?, delay_ms?, after_tokens?} (no rank: every rank) → the new list
 *   POST /sim/weights {version?} → {"weight_version"}: sets (or, without a version, bumps) the weight version
 */

const Weights = z.object({ version: z.union([z.string(), z.number()]).nullish() });

export function registerSimAdminRoutes(app: FastifyInstance, sim: SimState): void {
  const faults = () => ({ faults: sim.ranks.ranks.map((r) => faultJson(r.index, r.fault)) });

  app.get("/sim/stats", async () => ({
    kind: sim.opts.kind,
    model: sim.opts.model,
    family: sim.model.family.name,
    tool_call_parser: sim.model.toolParser,
    reasoning_parser: sim.model.reasoningParser,
    vocab_size: sim.tok.modelVocabSize,
    vllm_version: sim.opts.vllmVersion,
    dp_size: sim.ranks.size,
    weight_version: sim.weightVersion,
    paused: sim.engine.pauseMode,
    max_running: sim.opts.maxRunning,
    tokenize_requests: sim.tokenizeRequests,
    ranks: sim.ranks.ranks.map((r) => ({ rank: r.index, served: r.served, client_closed: r.clientClosed, running: r.running, waiting: r.waiting, cached_blocks: r.cache.size, fault: r.fault.mode })),
  }));

  app.get("/sim/faults", async () => faults());
  app.post("/sim/faults", async (req, reply) => {
    const parsed = FaultSpec.safeParse(req.body);
    if (!parsed.success) return reply.code(400).send({ error: formatZodError(parsed.error) });
    try {
      sim.setFault(parsed.data);
    } catch (e) {
      return reply.code(400).send({ error: (e as Error).message });
    }
    return faults();
  });

  app.post("/sim/weights", async (req, reply) => {
    const parsed = Weights.safeParse(req.body ?? {});
    if (!parsed.success) return reply.code(400).send({ error: formatZodError(parsed.error) });
    const v = parsed.data.version;
    sim.weightVersion = v === null || v === undefined ? sim.nextWeightVersion() : String(v);
    return { weight_version: sim.weightVersion };
  });
}
