/**
 * Contract tests of the `docker` sandbox runtime against a RECORDED Docker Engine API
 * (__fixtures__/docker-engine.ts): no Docker engine runs on our machines, so dockerode talks to a
 * local HTTP server that answers like dockerd (create/start/archive/exec with the hijacked
 * multiplexed stream/exec inspect/kill/delete/list), records every call and runs "programs" from a
 * small table against an in-memory filesystem. A real run is in README "Docker sandboxes".
 */
import { AgentSpec, EvaluatorSpec, RuntimeSpec } from "@rollgate/protocol";
import http from "node:http";
import type { AddressInfo } from "node:net";
import Docker from "dockerode";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { evaluate } from "../evaluators.js";
import { planHarness } from "../harnesses.js";
import { FakeDockerEngine } from "./__fixtures__/docker-engine.js";
import { DockerRuntime, dockerFromHost } from "./docker-runtime.js";
import { sandboxEnv } from "./environment.js";
import { SandboxUnavailable } from "./local-runtime.js";
import { MAX_READ_BYTES } from "./workdir.js";

const WORKER_PATH = "/opt/rollgate/node/bin:/opt/rollgate/node_modules/.bin:/usr/local/bin:/usr/bin:/bin";
const TOKEN = "rg-session-token-SECRET";

let engine: FakeDockerEngine;
let rt: DockerRuntime;

/** A container on the worker's network (the container mechanics); the sealed network has its own tests below. */
function spec(extra: Record<string, unknown> = {}): RuntimeSpec {
  return RuntimeSpec.parse({ kind: "docker", image: "python:3.12", network: "host", ...extra });
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

/** The status a proxy answers to CONNECT target. */
function connectVia(proxy: string, target: string): Promise<number> {
  const u = new URL(proxy);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, method: "CONNECT", path: target });
    req.on("connect", (res, socket) => {
      socket.destroy();
      resolve(res.statusCode ?? 0);
    });
    req.on("response", (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on("error", reject);
    req.end();
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
  it('is created as documented: image, sleep infinity, workdir, labels, limits, ROLLGATE_DOCKER_NETWORK for a "host" network, files copied in before start, no secret in its config', async () => {
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

  it("honours runtime.workdir, and labels a kept container so sweeps leave it", async () => {
    const sb = await rt.create("t-2", spec({ workdir: "/testbed", keep: true }));
    const body = engine.calls.find((c) => c.path === "/containers/create")!.body as { WorkingDir: string; HostConfig: { NetworkMode: string }; Labels: Record<string, string> };
    expect(body.WorkingDir).toBe("/testbed");
    expect(body.HostConfig.NetworkMode).toBe("rollgate-sandbox");
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
    const misconfigured = new DockerRuntime({ docker: new Docker({ host: "127.0.0.1", port: engine.port, protocol: "http" }), workerName: "worker-a", defaultNetwork: "nope" });
    await expect(misconfigured.create("t-5", spec())).rejects.toBeInstanceOf(SandboxUnavailable);
    expect(engine.containers.size).toBe(0);
  });
});

describe("docker runtime: steps", () => {
  it("runs prepare, harness and evaluator steps in order via exec with exactly the documented agent environment (the token only in each exec's Env)", async () => {
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

  it("readFile: a file over 32 MiB (a sparse file costs the agent nothing) reads as absent", async () => {
    const sb = await rt.create("t-huge", spec());
    await sb.exec(["fill", "huge.txt", String(MAX_READ_BYTES + 1)], opts());
    await sb.exec(["fill", "fits.txt", "5"], opts());
    expect(await sb.readFile("huge.txt")).toBeNull();
    expect(await sb.readFile("fits.txt")).toBe("xxxxx");
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
  it("an agent's background process does not outlive stopLeftovers: the evaluator reads what the grader wrote, not what the daemon keeps writing", async () => {
    // Every step is an exec into one long-lived container, so a process the agent left in the
    // background would go on writing while the evaluator runs.
    const sb = await rt.create("t-daemon", spec());
    const o = { env: env(sb.home, sb.tmp), timeoutMs: 5_000 };
    expect((await sb.exec(["daemon", "reward.json", '{"reward": 1}'], o)).exitCode).toBe(0);
    await sb.stopLeftovers?.();
    const ev = await evaluate(EvaluatorSpec.parse({ kind: "reward_file", command: ["write", "reward.json", '{"reward": 0}'] }), { sandbox: sb, env: o.env, summary: () => ({}) });
    expect(ev).toMatchObject({ kind: "scored", reward: 0 });
    // A daemon still alive would have rewritten it many times over by now (it writes every 5 ms).
    await new Promise((r) => setTimeout(r, 100));
    expect(await sb.readFile("reward.json")).toBe('{"reward": 0}');
    await sb.destroy();
  });

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

describe("docker runtime: the sealed network (the default)", () => {
  let gateway: http.Server;
  let gatewayUrl = "";
  const reached: string[] = [];
  beforeEach(async () => {
    reached.length = 0;
    gateway = http.createServer((req, res) => {
      reached.push(`${req.method} ${req.url}`);
      res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}');
    });
    await new Promise<void>((r) => gateway.listen(0, "127.0.0.1", r));
    gatewayUrl = `http://127.0.0.1:${(gateway.address() as AddressInfo).port}`;
  });
  afterEach(() => new Promise<void>((r) => gateway.close(() => r())));
  const sealed = (extra: Record<string, unknown> = {}) => RuntimeSpec.parse({ kind: "docker", image: "python:3.12", ...extra });
  const session = () => ({ id: "s-1", url: `${gatewayUrl}/s/s-1` });

  it("gets an internal network of its own (never the host's), and the relay on it forwards only the session's routes; destroy removes it all", async () => {
    const sb = await rt.create("t-sealed", sealed(), { session: session() });
    const netCreate = engine.calls.find((c) => c.path === "/networks/create")!;
    const netName = (netCreate.body as { Name: string }).Name;
    expect(netName).toMatch(/^rollgate-t-sealed-[0-9a-f]{6}$/);
    expect(netCreate.body).toEqual({
      Name: netName,
      Driver: "bridge",
      Internal: true,
      Attachable: false,
      EnableIPv6: false,
      Labels: { "rollgate.sandbox": "1", "rollgate.task": "t-sealed", "rollgate.worker": "worker-a" },
      Options: { "com.docker.network.bridge.enable_ip_masquerade": "false" },
    });
    const create = engine.calls.find((c) => c.path === "/containers/create")!.body as { HostConfig: Record<string, unknown> };
    expect(create.HostConfig.NetworkMode).toBe(netName);
    expect(create.HostConfig).not.toHaveProperty("PortBindings");
    expect(create.HostConfig).not.toHaveProperty("ExtraHosts");
    // The container is alone on its network.
    const containerName = engine.calls.find((c) => c.path === "/containers/create")!.query.get("name");
    expect([...engine.networks.get(netName)!.containers.values()].map((c) => c.name)).toEqual([containerName]);

    // The agent's session URL is the relay, on the network's gateway address.
    expect(sb.sessionUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/s\/s-1$/);
    expect((await fetch(`${sb.sessionUrl}/v1/models`)).status).toBe(200);
    const origin = new URL(sb.sessionUrl!).origin;
    for (const p of ["/v1/tasks", "/admin/engines", "/s/s-2/v1/models", "/metrics"]) expect((await fetch(`${origin}${p}`)).status, p).toBe(403);
    expect(reached).toEqual(["GET /s/s-1/v1/models"]);
    // No egress asked: no proxy variables.
    await sb.exec(["printenv"], opts());
    const execEnv = (engine.calls.filter((c) => c.path.endsWith("/exec")).at(-1)!.body as { Env: string[] }).Env;
    expect(execEnv.some((e) => /PROXY/i.test(e))).toBe(false);

    await sb.destroy();
    expect(engine.containers.size).toBe(0);
    expect(engine.networks.has(netName)).toBe(false);
    expect(engine.trace().slice(-1)[0]).toMatch(/^DELETE \/networks\//);
    await expect(fetch(`${sb.sessionUrl}/v1/models`)).rejects.toThrow();
  });

  it("with ROLLGATE_DOCKER_RELAY_CONTAINER, the worker's container joins the sandbox network for the rollout and leaves it after", async () => {
    const docker = new Docker({ host: "127.0.0.1", port: engine.port, protocol: "http" });
    const inContainer = new DockerRuntime({ docker, workerName: "worker-a", defaultNetwork: "rollgate-sandbox", relayContainer: "rollgate-worker-1" });
    engine.networkGateway = "10.99.0.1"; // not where the relay listens in this mode
    const sb = await inContainer.create("t-c", sealed(), { session: session() });
    const connect = engine.calls.find((c) => c.path.endsWith("/connect"))!;
    expect(connect.body).toEqual({ Container: "rollgate-worker-1" });
    expect(sb.sessionUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/s\/s-1$/);
    expect((await fetch(`${sb.sessionUrl}/v1/models`)).status).toBe(200);
    await sb.destroy();
    const tail = engine.trace().slice(-3).map((t) => t.replace(/[0-9a-f]{64}/g, ":id"));
    expect(tail).toEqual(["DELETE /containers/:id", "POST /networks/:id/disconnect", "DELETE /networks/:id"]);
    expect([...engine.networks.keys()]).toEqual(["bridge", "rollgate-sandbox"]);
  });

  it("runtime.egress: every step gets the relay as its HTTP(S) proxy (the gateway stays direct), which still refuses loopback and metadata", async () => {
    const sb = await rt.create("t-eg", sealed({ egress: ["*"] }), { session: session() });
    await sb.exec(["printenv"], opts());
    const execEnv = (engine.calls.filter((c) => c.path.endsWith("/exec")).at(-1)!.body as { Env: string[] }).Env;
    const origin = new URL(sb.sessionUrl!).origin;
    expect(execEnv).toEqual(expect.arrayContaining([`HTTPS_PROXY=${origin}`, `HTTP_PROXY=${origin}`, `https_proxy=${origin}`, "NO_PROXY=127.0.0.1,localhost"]));
    const gw = new URL(gatewayUrl);
    expect(await connectVia(origin, `${gw.hostname}:${gw.port}`)).toBe(403);
    expect(await connectVia(origin, "169.254.169.254:80")).toBe(403);
    await sb.destroy();
  });

  it("a container that cannot be created takes its network and relay with it", async () => {
    engine.failContainerCreate = "no space left on device";
    await expect(rt.create("t-fail", sealed(), { session: session() })).rejects.toThrow(/no space left/);
    expect(engine.trace().map((t) => t.replace(/[0-9a-f]{64}/g, ":id"))).toEqual([
      "GET /images/python:3.12/json",
      "POST /networks/create",
      "GET /networks/:id",
      "POST /containers/create",
      "DELETE /networks/:id",
    ]);
    expect([...engine.networks.keys()]).toEqual(["bridge", "rollgate-sandbox"]);
  });

  it("a worker that is not on the Docker host (the relay's address is not its own) fails the sandbox with the reason, leaving nothing", async () => {
    engine.networkGateway = "192.0.2.1";
    const err = await rt.create("t-remote", sealed(), { session: session() }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SandboxUnavailable);
    expect((err as Error).message).toMatch(/cannot listen on 192\.0\.2\.1 .*ROLLGATE_DOCKER_RELAY_CONTAINER/);
    expect([...engine.networks.keys()]).toEqual(["bridge", "rollgate-sandbox"]);
    expect(engine.containers.size).toBe(0);
  });

  it("the start-up sweep removes this worker's leftover sandbox networks too", async () => {
    const sb = await rt.create("t-left", sealed(), { session: session() });
    const netName = [...engine.networks.keys()].find((n) => n.startsWith("rollgate-t-left-"))!;
    // The worker "dies": its container and network stay behind; a fresh worker of the same name sweeps.
    const fresh = new DockerRuntime({ docker: new Docker({ host: "127.0.0.1", port: engine.port, protocol: "http" }), workerName: "worker-a", defaultNetwork: "rollgate-sandbox" });
    expect(await fresh.sweep()).toBe(1);
    expect(engine.networks.has(netName)).toBe(false);
    expect([...engine.networks.keys()]).toEqual(["bridge", "rollgate-sandbox"]);
    await sb.destroy();
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
