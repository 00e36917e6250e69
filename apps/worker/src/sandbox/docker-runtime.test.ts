/**
 * Contract tests of the `docker` sandbox runtime against a RECORDED Docker Engine API
 * (__fixtures__/docker-engine.ts): no Docker engine runs on our machines, so dockerode talks to a
 * local HTTP server that answers like dockerd (create/start/archive/exec with the hijacked
 * multiplexed stream/exec inspect/kill/delete/list), records every call and runs "programs" from a
 * small table against an in-memory filesystem. A real run is in README "Docker sandboxes".
 */
import { AgentSpec, EvaluatorSpec, RuntimeSpec } from "@rollgate/protocol";
import Docker from "dockerode";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { evaluate } from "../evaluators.js";
import { planHarness } from "../harnesses.js";
import { FakeDockerEngine } from "./__fixtures__/docker-engine.js";
import { DockerRuntime, dockerFromHost } from "./docker-runtime.js";
import { sandboxEnv } from "./environment.js";
import { SandboxUnavailable } from "./local-runtime.js";

const WORKER_PATH = "/opt/rollgate/node/bin:/opt/rollgate/node_modules/.bin:/usr/local/bin:/usr/bin:/bin";
const TOKEN = "rg-session-token-SECRET";

let engine: FakeDockerEngine;
let rt: DockerRuntime;

function spec(extra: Record<string, unknown> = {}): RuntimeSpec {
  return RuntimeSpec.parse({ kind: "docker", image: "python:3.12", ...extra });
}

function env(home = "/rollgate/home", tmp = "/rollgate/tmp", agentEnv: Record<string, string> = {}) {
  return sandboxEnv({
    sessionUrl: "http://gateway:8080/s/s-1",
    token: TOKEN,
    sessionId: "s-1",
    taskId: "t-1",
    instruction: "fix the bug; don't 'break' $things",
    home,
    tmp,
    path: WORKER_PATH,
    harnessEnv: { NO_UPDATE_NOTIFIER: "1" },
    agentEnv,
  });
}

const opts = (extra: Partial<{ timeoutMs: number; signal: AbortSignal }> = {}) => ({ env: env(), timeoutMs: 5_000, ...extra });

beforeEach(async () => {
  engine = await new FakeDockerEngine().start();
  const docker = new Docker({ host: "127.0.0.1", port: engine.port, protocol: "http" });
  rt = new DockerRuntime({ docker, workerName: "worker-a", defaultNetwork: "rollgate-sandbox", workerPath: WORKER_PATH });
});
afterEach(async () => {
  await engine.stop();
});

describe("docker runtime: the container", () => {
  it("is created as documented: image, sleep infinity, workdir, labels, limits, network, files copied in before start, no secret in its config", async () => {
    const sb = await rt.create("t-1", spec({ files: { "a.txt": "A", "src/pkg/b.py": "print(1)\n" }, resources: { cpu: "1.5", memory: "512Mi" } }));
    expect(engine.trace()).toEqual(["GET /images/python:3.12/json", "POST /containers/create", "PUT /containers/" + [...engine.containers.keys()][0] + "/archive", "POST /containers/" + [...engine.containers.keys()][0] + "/start"]);
    const create = engine.calls[1]!;
    expect(create.query.get("name")).toMatch(/^rollgate-t-1-[0-9a-f]{6}$/);
    expect(create.body).toEqual({
      name: create.query.get("name"),
      Image: "python:3.12",
      Cmd: ["sleep", "infinity"],
      WorkingDir: "/workspace",
      Env: [],
      Tty: false,
      OpenStdin: false,
      Labels: { "rollgate.sandbox": "1", "rollgate.task": "t-1", "rollgate.worker": "worker-a" },
      HostConfig: { NetworkMode: "rollgate-sandbox", NanoCpus: 1_500_000_000, Memory: 512 * 1024 * 1024, MemorySwap: 512 * 1024 * 1024, AutoRemove: false },
    });
    expect(engine.calls[2]!.query.get("path")).toBe("/");
    const c = [...engine.containers.values()][0]!;
    expect(c.fs.get("/workspace/a.txt")).toBe("A");
    expect(c.fs.get("/workspace/src/pkg/b.py")).toBe("print(1)\n");
    expect(c.fs.get("/rollgate/home")).toBeNull();
    expect(c.fs.get("/rollgate/tmp")).toBeNull();
    expect(sb.workdir).toBe("/workspace");
    expect(sb.home).toBe("/rollgate/home");
    expect(sb.describe()).toMatch(/^docker container rollgate-t-1-/);
    await sb.destroy();
  });

  it("honours runtime.workdir and runtime.network, and labels a kept container so sweeps leave it", async () => {
    const sb = await rt.create("t-2", spec({ workdir: "/testbed", network: "bridge", keep: true }));
    const body = engine.calls.find((c) => c.path === "/containers/create")!.body as { WorkingDir: string; HostConfig: { NetworkMode: string }; Labels: Record<string, string> };
    expect(body.WorkingDir).toBe("/testbed");
    expect(body.HostConfig.NetworkMode).toBe("bridge");
    expect(body.Labels["rollgate.keep"]).toBe("true");
    await sb.destroy();
    // kept: stopped, not removed
    expect(engine.trace().at(-1)).toMatch(/^POST \/containers\/.+\/kill$/);
    expect(engine.containers.size).toBe(1);
  });

  it("pulls a missing image once; an image that cannot be pulled or an unknown network is SandboxUnavailable", async () => {
    const sb = await rt.create("t-3", spec({ image: "busybox:latest" }));
    expect(engine.trace().slice(0, 3)).toEqual(["GET /images/busybox:latest/json", "POST /images/create", "POST /containers/create"]);
    await sb.destroy();
    await expect(rt.create("t-4", spec({ image: "no/such:1" }))).rejects.toBeInstanceOf(SandboxUnavailable);
    await expect(rt.create("t-5", spec({ network: "nope" }))).rejects.toBeInstanceOf(SandboxUnavailable);
    expect(engine.containers.size).toBe(0);
  });
});

describe("docker runtime: steps", () => {
  it("runs prepare, harness and evaluator steps in order via exec with exactly the DESIGN §6 environment (the token only in each exec's Env)", async () => {
    const sb = await rt.create("t-1", spec());
    const steps = [["echo", "prepare"], ["printenv"], ["echo", "evaluate"]];
    const results = [];
    for (const argv of steps) results.push(await sb.exec(argv, opts()));
    const c = [...engine.containers.values()][0]!;
    expect(c.execs.map((e) => e.argv)).toEqual(steps);
    expect(c.execs.every((e) => e.cwd === "/workspace")).toBe(true);
    // exec create → start (hijacked) → inspect, per step, in order
    const perStep = engine.trace().filter((t) => /exec/.test(t)).map((t) => t.replace(/[0-9a-f]{64}/g, ":id"));
    expect(perStep).toEqual(steps.flatMap(() => ["POST /containers/:id/exec", "POST /exec/:id/start", "GET /exec/:id/json"]));
    const execBody = engine.calls.find((x) => x.path.endsWith("/exec"))!.body as Record<string, unknown>;
    expect(execBody).toMatchObject({ Cmd: ["echo", "prepare"], WorkingDir: "/workspace", AttachStdout: true, AttachStderr: true, AttachStdin: false, Tty: false });
    // The §6 variables exactly; PATH is the image's own (the worker's host PATH means nothing in the container).
    const { PATH: _hostPath, ...sixEnv } = env();
    expect((execBody.Env as string[]).sort()).toEqual(Object.entries(sixEnv).map(([k, v]) => `${k}=${v}`).sort());
    const seen = JSON.parse(results[1]!.stdoutTail) as Record<string, string>;
    expect(seen).toEqual({ ...sixEnv, PATH: "/usr/local/bin:/usr/bin:/bin", PYTHON_VERSION: "3.12", LANG: "C.UTF-8" });
    expect(seen.OPENAI_API_KEY).toBe(TOKEN);
    // The container config never carries the token.
    expect(JSON.stringify(engine.calls.find((x) => x.path === "/containers/create")!.body)).not.toContain(TOKEN);
    await sb.destroy();
  });

  it("keeps a PATH the task sets itself", async () => {
    const sb = await rt.create("t-1", spec());
    const r = await sb.exec(["printenv"], { ...opts(), env: env(undefined, undefined, { PATH: "/venv/bin:/usr/bin" }) });
    expect((JSON.parse(r.stdoutTail) as Record<string, string>).PATH).toBe("/venv/bin:/usr/bin");
    await sb.destroy();
  });

  it("maps the demultiplexed output and the exit code into RunResult; a missing program is a spawnError", async () => {
    const sb = await rt.create("t-1", spec());
    const chunks: string[] = [];
    const r = await sb.exec(["noisy"], { ...opts(), onOutput: (b) => chunks.push(b.toString()) });
    expect(r).toMatchObject({ exitCode: 3, signal: null, timedOut: false, aborted: false, spawnError: null });
    expect(r.logTail).toBe("to stdout\nto stderr\nmore stdout\n");
    expect(r.stdoutTail).toBe("to stdout\nmore stdout\n");
    expect(chunks.join("")).toBe(r.logTail);
    expect((await sb.exec(["true"], opts())).exitCode).toBe(0);
    const missing = await sb.exec(["claude"], opts());
    expect(missing.exitCode).toBeNull();
    expect(missing.spawnError).toMatch(/executable file not found/);
    await sb.destroy();
  });

  it("readFile goes through GET /containers/:id/archive; writeHomeFiles lands in HOME", async () => {
    const sb = await rt.create("t-1", spec({ files: { "given.txt": "from the task" } }));
    await sb.exec(["write", "answer.txt", "42"], opts());
    expect(await sb.readFile("answer.txt")).toBe("42");
    expect(await sb.readFile("given.txt")).toBe("from the task");
    expect(await sb.readFile("missing.txt")).toBeNull();
    expect(await sb.readFile("../../etc/passwd")).toBeNull();
    const archiveReads = engine.calls.filter((c) => c.method === "GET" && c.path.endsWith("/archive")).map((c) => c.query.get("path"));
    expect(archiveReads).toEqual(["/workspace/answer.txt", "/workspace/given.txt", "/workspace/missing.txt"]);
    await sb.writeHomeFiles({ ".codex/config.toml": 'model = "x"\n' });
    expect([...engine.containers.values()][0]!.fs.get("/rollgate/home/.codex/config.toml")).toBe('model = "x"\n');
    await expect(sb.writeHomeFiles({ "../escape": "x" })).rejects.toThrow(/escapes/);
    await sb.destroy();
  });
});

describe("docker runtime: cleanup", () => {
  it("removes the container with force after a successful rollout", async () => {
    const sb = await rt.create("t-1", spec());
    await sb.exec(["true"], opts());
    await sb.destroy();
    await sb.destroy(); // always safe
    const del = engine.calls.filter((c) => c.method === "DELETE");
    expect(del).toHaveLength(1);
    expect(del[0]!.query.get("force")).toBe("true");
    expect(del[0]!.query.get("v")).toBe("true");
    expect(engine.containers.size).toBe(0);
  });

  it("removes it after a failed step, and when copying files in fails after create", async () => {
    const sb = await rt.create("t-1", spec());
    expect((await sb.exec(["false"], opts())).exitCode).toBe(1);
    await sb.destroy();
    expect(engine.containers.size).toBe(0);
    // A home file path cannot escape; a runtime file that does never reaches the engine (schema + runtime refuse it).
    await expect(rt.create("t-2", { ...spec(), files: { "../x": "y" } })).rejects.toThrow(/escapes/);
    expect(engine.containers.size).toBe(0);
  });

  it("a timeout kills the whole container (the step and all it started), the sandbox stays usable, and destroy removes it", async () => {
    const sb = await rt.create("t-1", spec());
    const t0 = Date.now();
    const r = await sb.exec(["sleep", "30"], opts({ timeoutMs: 200 }));
    expect(Date.now() - t0).toBeLessThan(3_000);
    expect(r).toMatchObject({ timedOut: true, aborted: false, exitCode: null, signal: "SIGKILL" });
    expect(r.logTail).toBe("sleeping\n");
    const c = [...engine.containers.values()][0]!;
    expect(c.running.size).toBe(0);
    expect(engine.trace().some((t) => /\/kill$/.test(t))).toBe(true);
    // The next step (an evaluator) starts the container again, files intact.
    const after = await sb.exec(["echo", "again"], opts());
    expect(after.exitCode).toBe(0);
    expect(engine.trace().filter((t) => /\/start$/.test(t) && t.includes("containers"))).toHaveLength(2);
    await sb.destroy();
    expect(engine.containers.size).toBe(0);
  });

  it("a cancel (abort signal) kills the container mid-step; destroy removes it", async () => {
    const sb = await rt.create("t-1", spec());
    const ac = new AbortController();
    setTimeout(() => ac.abort("cancelled by the trainer"), 150);
    const r = await sb.exec(["sleep", "30"], opts({ signal: ac.signal }));
    expect(r).toMatchObject({ aborted: true, timedOut: false, exitCode: null, signal: "SIGKILL" });
    expect([...engine.containers.values()][0]!.running.size).toBe(0);
    // Already aborted: nothing starts.
    const execsBefore = engine.calls.filter((c) => c.path.endsWith("/exec")).length;
    expect((await sb.exec(["true"], opts({ signal: ac.signal }))).aborted).toBe(true);
    expect(engine.calls.filter((c) => c.path.endsWith("/exec")).length).toBe(execsBefore);
    await sb.destroy();
    expect(engine.containers.size).toBe(0);
  });

  it("worker crash: the start-up sweep removes this worker's leftover containers (not other workers', not kept ones)", async () => {
    const mine = engine.addLeftover("worker-a");
    const kept = engine.addLeftover("worker-a", { "rollgate.keep": "true" });
    const theirs = engine.addLeftover("worker-b");
    expect(await rt.sweep()).toBe(1);
    const list = engine.calls.find((c) => c.path === "/containers/json")!;
    expect(list.query.get("all")).toBe("true");
    expect(JSON.parse(list.query.get("filters")!)).toEqual({ label: ["rollgate.worker=worker-a"] });
    expect(engine.containers.has(mine)).toBe(false);
    expect(engine.containers.has(kept)).toBe(true);
    expect(engine.containers.has(theirs)).toBe(true);
  });
});

describe("docker runtime: a rollout's sandbox part end to end", () => {
  it("home files, prepare, a command harness and a file evaluator, then removal — as rollout.ts drives them", async () => {
    const sb = await rt.create("t-e2e", spec({ files: { "task.md": "write 42 into answer.txt" }, prepare: [["echo", "setting up"]] }));
    const agent = AgentSpec.parse({ harness: "command", command: ["write", "answer.txt", "42"] });
    const plan = planHarness(agent, { instruction: "answer", sessionUrl: "http://gateway:8080/s/s-1", token: TOKEN });
    await sb.writeHomeFiles(plan.homeFiles);
    const stepEnv = env(sb.home, sb.tmp);
    const log: string[] = [];
    const o = { env: stepEnv, timeoutMs: 5_000, onOutput: (b: Buffer) => log.push(b.toString()) };
    expect((await sb.exec(["echo", "setting up"], o)).exitCode).toBe(0);
    expect((await sb.exec(plan.argv, o)).exitCode).toBe(0);
    const ev = await evaluate(EvaluatorSpec.parse({ kind: "file", path: "answer.txt", equals: "42" }), { sandbox: sb, env: stepEnv, summary: () => ({}) });
    expect(ev).toMatchObject({ kind: "scored", reward: 1 });
    const cmd = await evaluate(EvaluatorSpec.parse({ kind: "command", command: ["cat", "/workspace/answer.txt"], reward: "last_line_float" }), { sandbox: sb, env: stepEnv, summary: () => ({}) });
    expect(cmd).toMatchObject({ kind: "scored", reward: 42 });
    await sb.destroy();
    expect(log.join("")).toContain("setting up");
    expect(engine.containers.size).toBe(0);
  });
});

describe("dockerFromHost", () => {
  it("reads DOCKER_HOST-style addresses", () => {
    type Modem = { socketPath?: string; host?: string; port?: number; protocol?: string };
    const modem = (h: string) => dockerFromHost(h).modem as unknown as Modem;
    expect(modem("unix:///var/run/docker.sock").socketPath).toBe("/var/run/docker.sock");
    expect(modem("/run/user/1000/docker.sock").socketPath).toBe("/run/user/1000/docker.sock");
    const tcp = modem("tcp://10.0.0.5:2375");
    expect([tcp.host, tcp.port, tcp.protocol]).toEqual(["10.0.0.5", 2375, "http"]);
  });
});
