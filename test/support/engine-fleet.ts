import type { StartedChild } from "@rollgate/testkit";
import OpenAI from "openai";
import { startApp, stopChild } from "./apps.js";
import { apiClient } from "./http.js";
import { dropPrefix, uniquePrefix } from "./redis.js";

/** A session as the rank tests see it: its id, token and the engine it was assigned to. */
export type FleetSession = { id: string; token: string; engine: number };

/**
 * `count` engine-sim processes of one rank each behind one real gateway on its own key prefix,
 * with no periodic health round during a test (`ROLLGATE_HEALTH_INTERVAL_S` 600): only what a
 * failed call does can have a rank probed or drained.
 */
export class EngineFleet {
  engines: StartedChild[] = [];
  gw: StartedChild | null = null;
  private readonly prefix: string;
  readonly api = apiClient(() => this.url);

  constructor(
    name: string,
    private readonly count: number,
    private readonly tpotMs: number,
  ) {
    this.prefix = uniquePrefix(name);
  }

  get url(): string {
    if (!this.gw) throw new Error("the fleet is not started");
    return this.gw.ready;
  }

  readonly start = async (): Promise<void> => {
    this.engines = await Promise.all(Array.from({ length: this.count }, () => startApp("engine-sim", ["--port", "0", "--dp", "1", "--tpot-ms", String(this.tpotMs)], {})));
    this.gw = await startApp("gateway", ["--port", "0"], {
      ROLLGATE_KEY_PREFIX: this.prefix,
      ROLLGATE_ENGINES: JSON.stringify(this.engines.map((e) => ({ kind: "vllm", url: e.ready, dp_size: 1, profile: "qwen3" }))),
      ROLLGATE_HEALTH_INTERVAL_S: "600",
      ROLLGATE_HEALTH_FAILURES: "2",
    });
  };

  readonly stop = async (): Promise<void> => {
    if (this.gw) await stopChild(this.gw.proc, 5_000);
    await Promise.all(this.engines.map((e) => stopChild(e.proc, 5_000)));
    await dropPrefix(this.prefix);
  };

  readonly open = async (): Promise<FleetSession> => {
    const s = (await this.api("/v1/sessions", { body: {} })).body as { id: string; token: string };
    return { ...s, engine: (await this.api(`/v1/sessions/${s.id}`)).body.assignment.engine as number };
  };

  /** The OpenAI SDK as the session's agent, with no retries of its own. */
  readonly openai = (s: FleetSession): OpenAI => new OpenAI({ baseURL: `${this.url}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });
}
