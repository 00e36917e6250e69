import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { defaultSandboxPath, sandboxEnv } from "./environment.js";
import { runProcess } from "./process.js";
import { Spawner } from "./spawner.js";
import { makeSandboxDirs, removeSandboxDirs } from "./workdir.js";

const pathEnv = defaultSandboxPath(process.cwd());
const noCleanupError = (p: string, err: unknown) => {
  throw new Error(`cleanup of ${p} failed: ${String(err)}`);
};

/** Processes whose command line holds the marker (pgrep itself excluded; a shell around it would match). */
function survivors(marker: string): string {
  return spawnSync("pgrep", ["-f", marker]).stdout.toString().trim();
}

describe("sandboxEnv", () => {
  it("gives the agent the documented variables (docs/agent-environment.md) and nothing of the worker's own environment", () => {
    process.env.WORKER_SECRET = "must-not-leak";
    const env = sandboxEnv({
      sessionUrl: "http://gw/s/s-1",
      token: "tok",
      sessionId: "s-1",
      taskId: "t-1",
      instruction: "do it",
      home: "/tmp/w/home",
      tmp: "/tmp/w/tmp",
      path: "/usr/bin:/bin",
      harnessEnv: { DISABLE_TELEMETRY: "1", FOO: "preset" },
      agentEnv: { FOO: "bar" },
    });
    expect(env).toEqual({
      PATH: "/usr/bin:/bin",
      HOME: "/tmp/w/home",
      TMPDIR: "/tmp/w/tmp",
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
      DISABLE_TELEMETRY: "1",
      FOO: "bar",
    });
    delete process.env.WORKER_SECRET;
  });
});

describe("makeSandboxDirs", () => {
  it("writes runtime.files into a fresh working directory beside HOME and TMPDIR, and removes it all", async () => {
    const dirs = await makeSandboxDirs(undefined, "t-files", { "a.txt": "A", "repo/src/b.py": "print(1)\n" }, noCleanupError);
    expect(readFileSync(path.join(dirs.work, "a.txt"), "utf8")).toBe("A");
    expect(readFileSync(path.join(dirs.work, "repo/src/b.py"), "utf8")).toBe("print(1)\n");
    expect(existsSync(dirs.home) && existsSync(dirs.tmp)).toBe(true);
    await removeSandboxDirs(dirs);
    expect(existsSync(dirs.base)).toBe(false);
  });
  it("refuses a path that escapes the directory", async () => {
    await expect(makeSandboxDirs(undefined, "t-esc", { "../evil": "x" }, noCleanupError)).rejects.toThrow(/escapes/);
  });
});

const spawner = new Spawner();
afterAll(() => spawner.close());

// Every behaviour of a step, whether the worker forks it itself or its spawner does (the default).
describe.each([
  ["forked by this process", null],
  ["started by the spawner", spawner],
])("runProcess, %s", (_how, via) => {
  const base = { cwd: process.cwd(), env: { PATH: pathEnv }, spawner: via };

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

  it("does not run a step whose cancel came before it started", async () => {
    const ac = new AbortController();
    ac.abort("cancelled early");
    const r = await runProcess({ ...base, argv: ["sleep", "30"], timeoutMs: 20_000, signal: ac.signal });
    expect(r.aborted).toBe(true);
    expect(r.durationMs).toBeLessThan(5_000);
  });

  it("stops on abort (cancellation)", async () => {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 200);
    const r = await runProcess({ ...base, argv: ["sleep", "30"], timeoutMs: 20_000, signal: ac.signal });
    expect(r.aborted).toBe(true);
    expect(r.timedOut).toBe(false);
  });

  it("keeps stdout apart from stderr, and runs the program in the given folder with exactly the given environment", async () => {
    const r = await runProcess({ ...base, cwd: "/", env: { PATH: pathEnv, ONLY: "this" }, argv: ["bash", "-c", "echo \"$PWD $ONLY ${HOME:-nohome}\"; echo oops >&2"], timeoutMs: 10_000 });
    expect(r.stdoutTail).toBe("/ this nohome\n");
    expect(r.logTail).toContain("oops");
  });
});

describe("the spawner", () => {
  const base = { cwd: process.cwd(), env: { PATH: pathEnv } };

  it("is the parent of the programs it starts, not the worker", async () => {
    const r = await runProcess({ ...base, spawner, argv: ["bash", "-c", "echo $PPID"], timeoutMs: 10_000 });
    expect(r.exitCode).toBe(0);
    expect(Number(r.stdoutTail.trim())).not.toBe(process.pid);
  });

  it("when it dies, the steps it was running end as not started and their processes are killed; the next step gets a new one", async () => {
    const own = new Spawner();
    const marker = `rg-orphan-${randomUUID()}`;
    const step = runProcess({ ...base, spawner: own, argv: ["bash", "-c", `(exec -a ${marker} sleep 300) & echo up; wait`], timeoutMs: 20_000, onOutput: () => own.close() });
    const r = await step;
    expect(r.spawnError).toMatch(/spawner/);
    await new Promise((res) => setTimeout(res, 200));
    expect(survivors(marker)).toBe("");
    const next = await runProcess({ ...base, spawner: own, argv: ["bash", "-c", "exit 4"], timeoutMs: 10_000 });
    expect(next.exitCode).toBe(4);
    own.close();
  });
});
