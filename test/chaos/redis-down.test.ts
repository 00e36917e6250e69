/**
 * Redis going away under a running gateway: trainer and agent routes answer 503 (retryable, in
 * each caller's shape) instead of a 500, and the gateway itself stays up.
 */
import { startPrivateRedis, type StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";

let redis: Awaited<ReturnType<typeof startPrivateRedis>>;
let gw: StartedChild;

beforeAll(async () => {
  redis = await startPrivateRedis();
  gw = await startApp("gateway", ["--port", "0"], {
    REDIS_URL: redis.url,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1, model: "m" }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0",
  });
}, 30_000);

afterAll(async () => {
  await stopChild(gw.proc);
});

describe("Redis down", () => {
  it("answers 503 on trainer and agent routes, and the gateway stays up", async () => {
    expect((await fetch(`${gw.ready}/v1/tasks/t-x`)).status).toBe(404);
    await redis.stop();
    const task = await fetch(`${gw.ready}/v1/tasks/t-x`);
    expect(task.status).toBe(503);
    expect(((await task.json()) as { error: { type: string } }).error.type).toBe("unavailable");
    const agent = await fetch(`${gw.ready}/s/s-x/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: "Bearer t", "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hi" }] }),
    });
    expect(agent.status).toBe(503);
    expect(((await agent.json()) as { error: { type: string } }).error.type).toBe("api_error");
    expect((await fetch(`${gw.ready}/healthz`)).status).toBe(200);
    expect((await fetch(`${gw.ready}/readyz`)).status).toBe(503);
    expect(gw.proc.exitCode).toBeNull();
  });
});
