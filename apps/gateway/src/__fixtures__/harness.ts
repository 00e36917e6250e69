/**
 * The setup the gateway's integration tests share: an in-process engine-sim and gateway on real
 * ports, on the real Redis under a key prefix of their own that is dropped afterwards.
 */
import { randomUUID } from "node:crypto";
import { buildEngineSim, type EngineSimOptions } from "@rollgate/engine-sim";
import { type CompletionRecord } from "@rollgate/protocol";
import type { FastifyInstance } from "fastify";
import { Redis } from "ioredis";
import { pino, type Logger } from "pino";
import { buildGateway } from "../app.js";
import { GatewayEnv } from "../env.js";

export const TEST_REDIS_URL = process.env.REDIS_URL || "redis://127.0.0.1:6379";

/** The model profile of each engine-sim family (engine-sim serves Qwen3 unless told otherwise). */
export const PROFILE_OF_FAMILY: Record<string, string> = {
  qwen3: "qwen3",
  "qwen3-coder": "qwen3-coder",
  "llama3.1": "llama3",
  "deepseek-v3": "deepseek-v3",
  "deepseek-v3.1": "deepseek-v3.1",
  "gpt-oss": "gpt-oss",
};

const profileOfSim = (sim: EngineSimOptions) => PROFILE_OF_FAMILY[sim.family ?? "qwen3"];

/** Listens on a free loopback port and returns the base URL. */
export async function listenLocal(app: FastifyInstance): Promise<string> {
  await app.listen({ port: 0, host: "127.0.0.1" });
  const addr = app.server.address();
  return `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
}

/**
 * A gateway on a Redis of the test's own (a private redis-server the test may block, kill or
 * restart) in front of one vLLM-kind engine-sim of one rank, on the qwen3 profile; no health rounds.
 */
export function gatewayOnRedis(redisUrl: string, simUrl: string, prefix: string): Promise<FastifyInstance> {
  return buildGateway({
    env: GatewayEnv.parse({
      REDIS_URL: redisUrl,
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: simUrl, dp_size: 1, profile: "qwen3" }]),
      ROLLGATE_HEALTH_INTERVAL_S: "0",
    }),
    logger: pino({ level: "silent" }),
  });
}

/** Deletes every key under the prefixes (plain and hash-tagged forms). */
export async function dropPrefixes(prefixes: readonly string[]): Promise<void> {
  const redis = new Redis(TEST_REDIS_URL);
  try {
    for (const p of prefixes) {
      const found = [...(await redis.keys(`${p}:*`)), ...(await redis.keys(`{${p}:*`))];
      if (found.length) await redis.del(...found);
    }
  } finally {
    redis.disconnect();
  }
}

export interface Harness {
  sim: FastifyInstance;
  app: FastifyInstance;
  /** The gateway's base URL. */
  url: string;
  prefix: string;
  /** A new session through the session API. */
  openSession: () => Promise<{ id: string; token: string; urls: { openai: string; anthropic: string; gemini: string } }>;
  /** The session's completion records. */
  records: (sid: string) => Promise<CompletionRecord[]>;
  close: () => Promise<void>;
}

/**
 * engine-sim + gateway listening, with one engine of `sim.dpSize` ranks (vLLM unless `sim.kind` says), on the profile of `sim.family` (or `profile`);
 * `engineFields` adds to the engine's ROLLGATE_ENGINES entry.
 */
export async function startHarness(
  name: string,
  sim: EngineSimOptions = {},
  extraEnv: Record<string, string> = {},
  logger?: Logger,
  profile?: unknown,
  engineFields: Record<string, unknown> = {},
): Promise<Harness> {
  const prefix = `test-${name}-${randomUUID().slice(0, 8)}`;
  const engine = buildEngineSim({ dpSize: 1, ...sim });
  const simUrl = await listenLocal(engine);
  const env = GatewayEnv.parse({
    REDIS_URL: TEST_REDIS_URL,
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: sim.kind ?? "vllm", url: simUrl, dp_size: sim.dpSize ?? 1, profile: profile ?? profileOfSim(sim), ...engineFields }]),
    ...extraEnv,
  });
  const app = await buildGateway({ env, logger: logger ?? pino({ level: "silent" }) });
  const url = await listenLocal(app);
  return {
    sim: engine,
    app,
    url,
    prefix,
    openSession: async () => {
      const res = await fetch(`${url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
      if (res.status !== 201) throw new Error(`POST /v1/sessions answered ${res.status}`);
      return (await res.json()) as Awaited<ReturnType<Harness["openSession"]>>;
    },
    records: async (sid) => {
      const res = await fetch(`${url}/v1/sessions/${sid}/completions`);
      return ((await res.json()) as { completions: CompletionRecord[] }).completions;
    },
    close: async () => {
      await app.close();
      await engine.close();
      await dropPrefixes([prefix]);
    },
  };
}

export interface SimFleet {
  sim: FastifyInstance;
  /** engine-sim's base URL. */
  simUrl: string;
  /**
   * A gateway (not listening: use `inject`) under a key prefix of its own, on `engines` (default:
   * the sim as one vLLM engine of all its ranks); `env` adds or overrides variables.
   */
  gateway: (opts?: { engines?: unknown[]; env?: Record<string, string>; logger?: Logger }) => Promise<FastifyInstance>;
  /** Closes the sim and drops every gateway's keys (the gateways are the tests' to close, or not). */
  close: () => Promise<void>;
}

/** One engine-sim listening, and as many gateways on it as a test file needs, each with its own prefix. */
export async function startSimFleet(name: string, sim: EngineSimOptions = {}): Promise<SimFleet> {
  const engine = buildEngineSim({ dpSize: 2, ...sim });
  const simUrl = await listenLocal(engine);
  const prefixes: string[] = [];
  return {
    sim: engine,
    simUrl,
    gateway: async (opts = {}) => {
      const prefix = `test-${name}-${randomUUID().slice(0, 8)}`;
      prefixes.push(prefix);
      const env = GatewayEnv.parse({
        REDIS_URL: TEST_REDIS_URL,
        ROLLGATE_KEY_PREFIX: prefix,
        ROLLGATE_ENGINES: JSON.stringify(opts.engines ?? [{ kind: sim.kind ?? "vllm", url: simUrl, dp_size: sim.dpSize ?? 2, profile: profileOfSim(sim) }]),
        ...opts.env,
      });
      return buildGateway({ env, logger: opts.logger ?? pino({ level: "silent" }) });
    },
    close: async () => {
      await engine.close();
      await dropPrefixes(prefixes);
    },
  };
}
