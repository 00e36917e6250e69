import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { defaultSandboxPath, sandboxEnv } from "./environment.js";
import { runProcess } from "./process.js";
import { Spawner, pythonSpawnerUsable } from "./spawner.js";
import { makeSandboxDirs, removeSandboxDirs } from "./workdir.js";

const pathEnv = defaultSandboxPath(process.cwd());
const noCleanupError = (p: string, err: unknown) => {
  throw new Error(`cleanup of ${p} failed: ${String(err)}`);
};

/** This process's descriptors above 2 without close-on-exec (every program it forks inherits them). */
function inheritedFds(): string[] {
  return readdirSync("/proc/self/fd")
    .filter((fd) => Number(fd) > 2)
    .filter((fd) => {
      try {
        const flags = /^flags:\s+(\d+)$/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, "utf8"))?.[1];
        return flags !== undefined && (parseInt(flags, 8) & 0o2000000) === 0;
      } catch {
        return false; // closed meanwhile (the one readdir used)
      }
    })
    .sort((a, b) => Number(a) - Number(b));
}

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

const spawner = new Spawner({ kind: "node" });
const pySpawner = new Spawner({ kind: "python" });
afterAll(() => {
  spawner.close();
  pySpawner.close();
});

// Every behaviour of a step, whether the worker forks it itself or a spawner does (the default:
// the Python one where python3 can run it, else the node one).
describe.each([
  ["forked by this process", null],
  ["started by the node spawner", spawner],
  ["started by the Python spawner", pySpawner],
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

  it("keeps the order the program wrote its two streams in: a line printed after a flood on stderr ends the tail", async () => {
    // stderr's backlog (what the socket still holds when the flood's last write returns) comes
    // before the stdout line printed after it, however busy the machine.
    const flood = "head -c 4000000 /dev/zero | tr '\\0' e >&2; echo END";
    for (let i = 0; i < 3; i++) {
      const r = await runProcess({ ...base, argv: ["bash", "-c", flood], timeoutMs: 20_000, maxLogBytes: 1024 });
      expect(r.exitCode).toBe(0);
      expect(r.logTail.trimEnd().endsWith("END")).toBe(true);
    }
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

  it("starts the program as node's spawn does: its own session, stdin /dev/null, output on sockets, no signal ignored or blocked, no other descriptor", async () => {
    const script = [
      'echo "sid=$(ps -o sid= -p $$ | tr -d " ") pid=$$"',
      // the shell's own descriptors ($$), as the starter left them
      "readlink /proc/$$/fd/0",
      "readlink /proc/$$/fd/1 | cut -d: -f1",
      "readlink /proc/$$/fd/2 | cut -d: -f1",
      "grep -E '^Sig(Ign|Blk):' /proc/self/status",
    ].join("; ");
    const r = await runProcess({ ...base, argv: ["bash", "-c", script], timeoutMs: 10_000 });
    const [ids, stdin, stdout, stderr, blk, ign] = r.stdoutTail.trim().split("\n");
    const m = /^sid=(\d+) pid=(\d+)$/.exec(ids!);
    expect(m?.[1]).toBe(m?.[2]);
    expect([stdin, stdout, stderr]).toEqual(["/dev/null", "socket", "socket"]);
    // bash ignores nothing itself; what is ignored or blocked here came from the starter. glibc's
    // posix_spawn (the Python spawner's) leaves its own two internal signals, 32 and 33, ignored
    // (bits 31 and 32 of the mask); a libc arms them itself when it uses them, nothing else does.
    expect(blk).toMatch(/^SigBlk:\s+0+$/);
    expect(BigInt(`0x${ign!.split(/\s+/)[1]}`) & ~0x180000000n).toBe(0n);
    // Besides 0-2, only what this process itself lets every child inherit (the test runner leaves
    // one of its own open) and the folder ls reads: nothing of the spawner's (its channel, other
    // steps' sockets). ls is started directly: a shell would hold pipes of its own meanwhile.
    const ls = await runProcess({ ...base, argv: ["ls", "-1", "/proc/self/fd"], timeoutMs: 10_000 });
    const inherited = new Set(["0", "1", "2", ...inheritedFds()]);
    expect(ls.stdoutTail.trim().split("\n").filter((fd) => !inherited.has(fd))).toHaveLength(1);
  });

  it("looks the program up on the PATH of the environment it is given, and says when it may not run it", async () => {
    const onOwn = await runProcess({ ...base, env: { PATH: `/nonexistent:${pathEnv}` }, argv: ["true"], timeoutMs: 10_000 });
    expect(onOwn).toMatchObject({ exitCode: 0, spawnError: null });
    const notOnIt = await runProcess({ ...base, env: { PATH: "/nonexistent" }, argv: ["true"], timeoutMs: 10_000 });
    expect(notOnIt.spawnError).toBe("spawn true ENOENT");
    const notExecutable = await runProcess({ ...base, argv: ["/etc/passwd"], timeoutMs: 10_000 });
    expect(notExecutable.spawnError).toBe("spawn /etc/passwd EACCES");
    const noFolder = await runProcess({ ...base, cwd: "/nonexistent-folder", argv: ["true"], timeoutMs: 10_000 });
    expect(noFolder.spawnError).toBe("spawn true ENOENT");
  });

  it("reports a program killed by a signal as its signal", async () => {
    const r = await runProcess({ ...base, argv: ["bash", "-c", "kill -USR1 $$"], timeoutMs: 10_000 });
    expect(r).toMatchObject({ exitCode: null, signal: "SIGUSR1", spawnError: null });
  });
});

describe("the spawner", () => {
  const base = { cwd: process.cwd(), env: { PATH: pathEnv } };

  it("is the Python one by default where python3 can run it", () => {
    expect(pythonSpawnerUsable()).toBe(true); // this test machine has one
    expect(new Spawner().kind).toBe("python");
  });

  it("is the node one where there is no python3, and runs steps the same", async () => {
    const own = new Spawner({ path: "/nonexistent-folder" });
    expect(own.kind).toBe("node");
    const r = await runProcess({ ...base, spawner: own, argv: ["bash", "-c", "echo $(tr '\\0' ' ' < /proc/$PPID/cmdline); exit 5"], timeoutMs: 10_000 });
    expect(r).toMatchObject({ exitCode: 5, spawnError: null });
    expect(r.stdoutTail).toMatch(/node .*rollgate-sandbox-spawner/);
    own.close();
  });

  it.each(["node", "python"] as const)("(%s) holds little of an output flood the worker reads slower than the program writes: the program waits", async (kind) => {
    const own = new Spawner({ kind });
    let spawnerPid = 0;
    let peakKb = 0;
    const rssKb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0);
    let bytes = 0;
    const r = await runProcess({
      ...base,
      spawner: own,
      argv: ["bash", "-c", "echo $PPID; head -c 400000000 /dev/zero"],
      timeoutMs: 120_000,
      onOutput: (b) => {
        bytes += b.length;
        spawnerPid ||= Number(/^(\d+)\n/.exec(b.toString("latin1", 0, 16))?.[1] ?? 0);
        // A worker busy with other rollouts: a millisecond per chunk.
        const until = Date.now() + 1;
        while (Date.now() < until);
        if (spawnerPid) peakKb = Math.max(peakKb, rssKb(spawnerPid));
      },
    });
    own.close();
    expect(r.exitCode).toBe(0);
    expect(bytes).toBeGreaterThan(400_000_000);
    expect(spawnerPid).toBeGreaterThan(0);
    expect(peakKb / 1024).toBeLessThan(150);
  }, 180_000);

  it.each(["node", "python"] as const)("(%s) is the parent of the programs it starts, not the worker", async (kind) => {
    const via = kind === "node" ? spawner : pySpawner;
    const r = await runProcess({ ...base, spawner: via, argv: ["bash", "-c", "echo $PPID; echo $(tr '\\0' ' ' < /proc/$PPID/cmdline)"], timeoutMs: 10_000 });
    expect(r.exitCode).toBe(0);
    const [ppid, cmdline] = r.stdoutTail.trim().split("\n");
    expect(Number(ppid)).not.toBe(process.pid);
    expect(cmdline).toMatch(kind === "node" ? /node/ : /python3?/);
    expect(cmdline).toContain("rollgate-sandbox-spawner");
  });

  it.each(["node", "python"] as const)("(%s) when it dies, the steps it was running end as not started and their processes are killed; the next step gets a new one", async (kind) => {
    const own = new Spawner({ kind });
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
