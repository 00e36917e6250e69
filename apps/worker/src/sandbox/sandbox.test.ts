import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { defaultSandboxPath, sandboxEnv } from "./environment.js";
import { runProcess } from "./process.js";
import { makeWorkdir, removeWorkdir } from "./workdir.js";

const pathEnv = defaultSandboxPath(process.cwd());

/** Processes whose command line holds the marker (pgrep itself excluded; a shell around it would match). */
function survivors(marker: string): string {
  return spawnSync("pgrep", ["-f", marker]).stdout.toString().trim();
}

describe("sandboxEnv", () => {
  it("gives the agent the DESIGN §6 variables and nothing of the worker's own environment", () => {
    process.env.WORKER_SECRET = "must-not-leak";
    const env = sandboxEnv({
      sessionUrl: "http://gw/s/s-1",
      token: "tok",
      sessionId: "s-1",
      taskId: "t-1",
      instruction: "do it",
      workdir: "/tmp/w",
      path: "/usr/bin:/bin",
      agentEnv: { FOO: "bar" },
    });
    expect(env).toEqual({
      PATH: "/usr/bin:/bin",
      HOME: "/tmp/w",
      TMPDIR: "/tmp/w/.tmp",
      LANG: "C.UTF-8",
      OPENAI_BASE_URL: "http://gw/s/s-1/v1",
      OPENAI_API_KEY: "tok",
      ANTHROPIC_BASE_URL: "http://gw/s/s-1",
      ANTHROPIC_API_KEY: "tok",
      GOOGLE_GEMINI_BASE_URL: "http://gw/s/s-1",
      GEMINI_API_KEY: "tok",
      ROLLGATE_SESSION_ID: "s-1",
      ROLLGATE_TASK_ID: "t-1",
      ROLLGATE_INSTRUCTION: "do it",
      FOO: "bar",
    });
    delete process.env.WORKER_SECRET;
  });
});

describe("makeWorkdir", () => {
  it("writes runtime.files into a fresh directory and removes it afterwards", async () => {
    const dir = await makeWorkdir(undefined, "t-files", { "a.txt": "A", "repo/src/b.py": "print(1)\n" });
    expect(readFileSync(path.join(dir, "a.txt"), "utf8")).toBe("A");
    expect(readFileSync(path.join(dir, "repo/src/b.py"), "utf8")).toBe("print(1)\n");
    await removeWorkdir(dir);
    expect(existsSync(dir)).toBe(false);
  });
  it("refuses a path that escapes the directory", async () => {
    await expect(makeWorkdir(undefined, "t-esc", { "../evil": "x" })).rejects.toThrow(/escapes/);
  });
});

describe("runProcess", () => {
  const base = { cwd: process.cwd(), env: { PATH: pathEnv } };

  it("reports the exit code and keeps the output tail", async () => {
    const r = await runProcess({ ...base, argv: ["bash", "-c", "echo out; echo err >&2; exit 3"], timeoutMs: 10_000 });
    expect(r).toMatchObject({ exitCode: 3, timedOut: false, spawnError: null });
    expect(r.logTail).toContain("out");
    expect(r.logTail).toContain("err");
  });

  it("keeps only the last bytes of a long output", async () => {
    const r = await runProcess({ ...base, argv: ["bash", "-c", "seq 1 100000"], timeoutMs: 10_000, maxLogBytes: 100 });
    expect(r.logTail.length).toBeLessThanOrEqual(100);
    expect(r.logTail.trim().endsWith("100000")).toBe(true);
  });

  it("says when the program does not exist", async () => {
    const r = await runProcess({ ...base, argv: ["no-such-program-here"], timeoutMs: 10_000 });
    expect(r.spawnError).toMatch(/ENOENT/);
  });

  it("kills the whole process group on timeout, grandchildren included", async () => {
    const marker = `rg-test-${randomUUID()}`;
    const r = await runProcess({
      ...base,
      argv: ["bash", "-c", `(exec -a ${marker} sleep 300) & (exec -a ${marker} sleep 300)`],
      timeoutMs: 300,
    });
    expect(r.timedOut).toBe(true);
    expect(survivors(marker)).toBe("");
  });

  it("does not wait for a background process the agent left behind, and kills it", async () => {
    const marker = `rg-bg-${randomUUID()}`;
    const r = await runProcess({ ...base, argv: ["bash", "-c", `(exec -a ${marker} sleep 300) & echo started`], timeoutMs: 20_000 });
    expect(r).toMatchObject({ exitCode: 0, timedOut: false });
    expect(r.durationMs).toBeLessThan(10_000);
    expect(survivors(marker)).toBe("");
  });

  it("stops on abort (cancellation)", async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 200);
    const r = await runProcess({ ...base, argv: ["sleep", "30"], timeoutMs: 20_000, signal: ac.signal });
    expect(r.aborted).toBe(true);
    expect(r.timedOut).toBe(false);
  });
});
