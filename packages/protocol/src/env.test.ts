import { describe, expect, it } from "vitest";
import { GatewayEnv, WorkerEnv, parseEnv } from "./env.js";

describe("app environments", () => {
  it("fills the documented defaults", () => {
    const env = parseEnv(GatewayEnv, { ROLLGATE_ENGINES: '[{"kind":"vllm","url":"http://e:8000/"}]' });
    expect(env).toMatchObject({ PORT: 8080, REDIS_URL: "redis://127.0.0.1:6379", ROLLGATE_KEY_PREFIX: "rg", LOG_LEVEL: "info" });
    expect(env.ROLLGATE_ENGINES).toEqual([{ kind: "vllm", url: "http://e:8000", dp_size: 1 }]);
    expect(parseEnv(WorkerEnv, {}).ROLLGATE_WORKER_CONCURRENCY).toBe(4);
  });

  it("stops on a bad value with a message naming every bad variable, never a silent default", () => {
    expect(() => parseEnv(GatewayEnv, { PORT: "eighty", ROLLGATE_ENGINES: "[" })).toThrow(/PORT[\s\S]*ROLLGATE_ENGINES: must be a JSON list/);
    expect(() => parseEnv(GatewayEnv, { ROLLGATE_ENGINES: '[{"kind":"tgi","url":"http://e"}]' })).toThrow(/ROLLGATE_ENGINES\.0\.kind/);
    expect(() => parseEnv(WorkerEnv, { REDIS_URL: "localhost:6379" })).toThrow(/REDIS_URL: must be redis:\/\//);
    expect(parseEnv(WorkerEnv, { REDIS_URL: "redis+cluster://10.0.0.1:7000,10.0.0.2:7001" }).REDIS_URL).toContain("cluster");
    expect(() => parseEnv(WorkerEnv, { ROLLGATE_WORKER_CONCURRENCY: "0" })).toThrow(/ROLLGATE_WORKER_CONCURRENCY/);
  });
});
