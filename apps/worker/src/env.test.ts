import { describe, expect, it } from "vitest";
import { loadWorkerEnv } from "./env.js";

describe("worker environment", () => {
  it("fills the documented defaults", () => {
    expect(loadWorkerEnv({})).toMatchObject({ ROLLGATE_WORKER_CONCURRENCY: 4, ROLLGATE_GATEWAY_URL: "http://127.0.0.1:8080", ROLLGATE_RUNTIMES: ["local"], LOG_LEVEL: "info" });
  });

  it("stops on a bad value with a message naming every bad variable, never a silent default", () => {
    expect(() => loadWorkerEnv({ REDIS_URL: "localhost:6379" })).toThrow(/REDIS_URL: must be redis:\/\//);
    expect(loadWorkerEnv({ REDIS_URL: "redis+cluster://10.0.0.1:7000,10.0.0.2:7001" }).REDIS_URL).toContain("cluster");
    expect(() => loadWorkerEnv({ ROLLGATE_WORKER_CONCURRENCY: "0", ROLLGATE_CALLBACK_ALLOW: "http://x" })).toThrow(/ROLLGATE_WORKER_CONCURRENCY[\s\S]*ROLLGATE_CALLBACK_ALLOW/);
    // Root is no sandbox user: RLIMIT_NPROC would not bind it.
    expect(() => loadWorkerEnv({ ROLLGATE_SANDBOX_UID: "0", ROLLGATE_SANDBOX_GID: "nogroup", ROLLGATE_SANDBOX_PROCESS_MEMORY_MB: "-1" })).toThrow(
      /ROLLGATE_SANDBOX_PROCESS_MEMORY_MB[\s\S]*ROLLGATE_SANDBOX_UID[\s\S]*ROLLGATE_SANDBOX_GID/,
    );
    expect(loadWorkerEnv({})).toMatchObject({ ROLLGATE_SANDBOX_UID: 65534, ROLLGATE_SANDBOX_GID: 65534, ROLLGATE_SANDBOX_PROCESS_MEMORY_MB: 8192 });
  });

  it("refuses a sandbox PATH with an empty or relative entry: it would find the agent's ./python3 before the grader's", () => {
    for (const bad of ["/usr/bin:", ":/usr/bin", "/usr/bin::/bin", "/usr/bin:.", "bin:/usr/bin"]) {
      expect(() => loadWorkerEnv({ ROLLGATE_SANDBOX_PATH: bad }), bad).toThrow(/ROLLGATE_SANDBOX_PATH: must be a colon list of absolute folders/);
    }
    expect(loadWorkerEnv({ ROLLGATE_SANDBOX_PATH: "/opt/agents/bin:/usr/bin:/bin" }).ROLLGATE_SANDBOX_PATH).toBe("/opt/agents/bin:/usr/bin:/bin");
  });
});
