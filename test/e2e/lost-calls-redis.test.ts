/**
 * A call lost while Redis is away: the gateway cannot write the mark then, so it holds it and
 * writes it once Redis answers again. Real processes: a redis-server of the test's own (killed and
 * started again on the same port), engine-sim and a gateway.
 */
import { spawnSync } from "node:child_process";
import type { StartedChild } from "@rollgate/testkit";
import type { Session } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { startOwnRedis, type OwnRedis } from "../support/own-redis.js";
import { poll } from "../support/poll.js";

const hasRedisServer = spawnSync("redis-server", ["--version"]).status === 0;
let redis: OwnRedis;
const procs: StartedChild[] = [];
let gw: StartedChild;
const api = apiClient(() => gw.ready);

beforeAll(async () => {
  if (!hasRedisServer) return;
  redis = await startOwnRedis();
  const engine = await startApp("engine-sim", ["--port", "0"], {});
  procs.push(engine);
  gw = await startApp("gateway", ["--port", "0"], {
    REDIS_URL: redis.url,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 1 }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0",
  });
  procs.push(gw);
}, 60_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => stopChild(p.proc, 5_000)));
  await redis?.stop();
});

const call = (sid: string, token: string) =>
  fetch(`${gw.ready}/s/${sid}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "hi" }] }),
  });

// A private redis-server is needed to take Redis away without touching the one other tests share.
describe.skipIf(!hasRedisServer)("a call lost while Redis is away (needs redis-server)", () => {
  it("is answered 503, held by the gateway, and written on the session once Redis is back; a stranger's call is not", async () => {
    const s = (await api("/v1/sessions", { body: {} })).body as { id: string; token: string };
    expect((await call(s.id, s.token)).status).toBe(200);
    // The agent is answered before its record is stored: the session read waits for this
    // gateway's writes, so Redis goes away only once the first call is recorded.
    expect(((await api(`/v1/sessions/${s.id}`)).body as Session).counts.llm_calls).toBe(1);

    await redis.kill();
    const lost = await call(s.id, s.token);
    expect(lost.status).toBe(503);
    expect(((await lost.json()) as { error: { code: string } }).error.code).toBe("storage_unavailable");
    // Another sandbox's call on this session id, with its own token: checked once Redis can tell.
    expect((await call(s.id, "someone-elses-token")).status).toBe(503);
    await redis.start();

    const marked = await poll(
      async () => ((await api(`/v1/sessions/${s.id}`)).body as Session | null)?.lost_calls,
      (l) => (l?.count ?? 0) > 0,
      20_000,
      200,
    );
    expect(marked).toMatchObject({ count: 1, first: { kind: "storage_unavailable", status: 503 } });
    const closed = (await api(`/v1/sessions/${s.id}/close`, { body: {} })).body as Session;
    expect(closed.state).toBe("closed");
    expect(closed.lost_calls.count).toBe(1);
    expect(gw.proc.exitCode).toBeNull();
  }, 60_000);
});
