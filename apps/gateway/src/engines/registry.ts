import { setMaxListeners } from "node:events";
import { profileOf, type ModelProfile } from "@rollgate/models";
import { rankMember } from "@rollgate/store";
import { Agent, request } from "undici";
import { z } from "zod";
import { probeCapabilities, type EngineCapabilities } from "./capabilities.js";
import { CachedDetokenizer } from "./detokenize.js";
import type { TokenizeCall } from "./tokenizer.js";
import type { EngineConfig } from "../env.js";

const ModelList = z.object({ data: z.array(z.object({ id: z.string() })).min(1) });

/** One routing target: an engine and one of its data-parallel ranks. */
export interface RankTarget {
  engineIndex: number;
  engine: EngineConfig;
  dpRank: number;
  /** What rollgate knows of the engine's model family (ROLLGATE_ENGINES[].profile). */
  profile: ModelProfile;
}

/**
 * The configured engines, their ranks, and the model name each serves. Engines are HTTP servers
 * we share one keep-alive pool with (undici Agent: one pool per origin).
 */
export class EngineRegistry {
  private readonly servedModels = new Map<number, Promise<string>>();
  private readonly caps = new Map<number, Promise<EngineCapabilities>>();
  readonly dispatcher: Agent;
  /** Per engine, its model profile (a bad one throws here: loadGatewayEnv reports it first). */
  readonly profiles: ModelProfile[];
  private readonly detokenizer: CachedDetokenizer;

  constructor(
    readonly engines: EngineConfig[],
    timeoutMs: number,
    /** Connections per engine URL (ROLLGATE_ENGINE_CONNECTIONS): every session may have a call in flight. */
    connectionsPerEngine = 4096,
  ) {
    this.profiles = engines.map((e) => profileOf(e.profile, e.vocab_size));
    this.dispatcher = new Agent({
      connections: connectionsPerEngine,
      keepAliveTimeout: 60_000,
      headersTimeout: timeoutMs,
      bodyTimeout: timeoutMs,
    });
    this.detokenizer = new CachedDetokenizer(this.dispatcher);
  }

  members(): string[] {
    return this.engines.flatMap((e, i) => Array.from({ length: e.dp_size }, (_, r) => rankMember(i, r)));
  }

  target(engineIndex: number, dpRank: number): RankTarget {
    const engine = this.engines[engineIndex];
    if (!engine || dpRank >= engine.dp_size) throw new Error(`no engine rank ${engineIndex}:${dpRank} is configured`);
    return { engineIndex, engine, dpRank, profile: this.profiles[engineIndex]! };
  }

  /**
   * What the engine can do beyond its chat route (capabilities.ts), probed on its first rank once
   * and kept; a probe that fails (engine down) is retried on the next ask.
   */
  capabilities(engineIndex: number): Promise<EngineCapabilities> {
    let pending = this.caps.get(engineIndex);
    if (!pending) {
      pending = this.servedModel(engineIndex).then((model) => probeCapabilities(this.probeCall(engineIndex, model)));
      pending.catch(() => this.caps.delete(engineIndex));
      this.caps.set(engineIndex, pending);
    }
    return pending;
  }

  /** Forgets what was probed of an engine (a restarted engine may be another version). */
  forgetCapabilities(engineIndex: number): void {
    this.caps.delete(engineIndex);
  }

  /** A call for the gateway's own requests to an engine's first rank (probes, preflight). */
  probeCall(engineIndex: number, model: string): TokenizeCall {
    // Preflight sends its probes at once on this one signal (a listener each while in flight):
    // more than Node's default of 10 is expected, not a leak.
    const signal = AbortSignal.timeout(60_000);
    setMaxListeners(0, signal);
    return {
      target: this.target(engineIndex, 0),
      model,
      request: { messages: [{ role: "user", content: "rollgate probe" }], sampling: {}, stream: false, client_logprobs: null },
      signal,
      dispatcher: this.dispatcher,
    };
  }

  /** Token ids → text, by the engine's own tokenizer (cached): what people read of a trajectory. */
  async decode(engineIndex: number, ids: readonly number[]): Promise<string> {
    const engine = this.engines[engineIndex];
    if (!engine) throw new Error(`no engine ${engineIndex}`);
    return this.detokenizer.decode(engine, await this.servedModel(engineIndex), ids);
  }

  /** The index of the engine at `url` (records name their engine by URL), or -1. */
  indexOf(url: string): number {
    return this.engines.findIndex((e) => e.url === url);
  }

  /** The model name to send to an engine: configured, or the first one its /v1/models lists. */
  servedModel(engineIndex: number): Promise<string> {
    const engine = this.engines[engineIndex];
    if (!engine) return Promise.reject(new Error(`no engine ${engineIndex}`));
    if (engine.model) return Promise.resolve(engine.model);
    let pending = this.servedModels.get(engineIndex);
    if (!pending) {
      pending = this.fetchModel(engine.url);
      // A failed lookup is retried on the next call instead of being cached.
      pending.catch(() => this.servedModels.delete(engineIndex));
      this.servedModels.set(engineIndex, pending);
    }
    return pending;
  }

  private async fetchModel(url: string): Promise<string> {
    const res = await request(`${url}/v1/models`, { dispatcher: this.dispatcher, headersTimeout: 10_000, bodyTimeout: 10_000 });
    const body = await res.body.json();
    if (res.statusCode !== 200) throw new Error(`GET ${url}/v1/models answered ${res.statusCode}`);
    return ModelList.parse(body).data[0]!.id;
  }

  async close(): Promise<void> {
    await this.dispatcher.close();
  }
}
