/**
 * Contract tests of the `kubernetes` sandbox runtime against a RECORDED Kubernetes API
 * (__fixtures__/kube-apiserver.ts): no cluster runs on our machines, so @kubernetes/client-node
 * talks to a local HTTP server, loaded from a kubeconfig string, that answers the core/v1 pod and
 * secret calls and the pod exec WebSocket (channel-prefixed frames: 1 stdout, 2 stderr, 3 status)
 * like the API server and kubelet do, and records them. The step script itself is also run by the
 * real `sh` here. A real run is in README "Running on Kubernetes".
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, symlinkSync, truncateSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { KubeConfig } from "@kubernetes/client-node";
import { EvaluatorSpec, RuntimeSpec } from "@rollgate/protocol";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FakeKubeApi } from "./__fixtures__/kube-apiserver.js";
import { sandboxEnv } from "./environment.js";
import { evaluate } from "../evaluators.js";
import { KubernetesRuntime, stepCommand, stepScript, tokenFromEnv } from "./kubernetes-runtime.js";
import { SandboxUnavailable } from "./local-runtime.js";
import { READ_FILE_SCRIPT } from "./container-common.js";
import { MAX_READ_BYTES } from "./workdir.js";

const WORKER_PATH = "/opt/rollgate/node/bin:/opt/rollgate/node_modules/.bin:/usr/local/bin:/usr/bin:/bin";
const TOKEN = "rg-session-token-SECRET";
const NS = "rollgate-sandboxes";
const INSTRUCTION = "fix the bug; don't 'break' $things";

let api: FakeKubeApi;

function runtime(extra: Partial<ConstructorParameters<typeof KubernetesRuntime>[0]> = {}) {
  const kc = new KubeConfig();
  kc.loadFromString(api.kubeconfig());
  return new KubernetesRuntime({ kc, namespace: NS, maxPods: 4, startTimeoutMs: 5_000, pollMs: 10, workerName: "worker-a", workerPath: WORKER_PATH, ...extra });
}

function spec(extra: Record<string, unknown> = {}): RuntimeSpec {
  return RuntimeSpec.parse({ kind: "kubernetes", image: "python:3.12", ...extra });
}

function env(agentEnv: Record<string, string> = {}) {
  return sandboxEnv({
    sessionUrl: "http://rollgate-gateway.rollgate:8080/s/s-1",
    token: TOKEN,
    sessionId: "s-1",
    taskId: "t-1",
    instruction: INSTRUCTION,
    home: "/rollgate/home",
    tmp: "/rollgate/tmp",
    path: WORKER_PATH,
    harnessEnv: { NO_UPDATE_NOTIFIER: "1" },
    agentEnv,
  });
}

const opts = (extra: Partial<{ timeoutMs: number; signal: AbortSignal }> = {}) => ({ env: env(), timeoutMs: 5_000, ...extra });
const wsCalls = () => api.calls.filter((c) => c.method === "WS");

beforeEach(async () => {
  api = await new FakeKubeApi().start();
});
afterEach(async () => {
  await api.stop();
});

describe("kubernetes runtime: the pod", () => {
  it("is built as documented: image, limits = requests, labels, no SA token, the session token only through a per-pod Secret (secretKeyRef, owner → pod)", async () => {
    const rt = runtime();
    const sb = await rt.create("T_1.x", spec({ files: { "a.txt": "A", "src/b.py": "print(1)\n" }, resources: { cpu: "500m", memory: "1Gi" }, service_account: "sandbox", node_selector: { pool: "rollouts" } }), { sessionToken: TOKEN, timeoutS: 600 });
    const podName = sb.describe().split("/")[1]!;
    expect(podName).toMatch(/^rg-t-1-x-[0-9a-f]{6}$/);
    expect(api.trace().slice(0, 3)).toEqual([`POST /api/v1/namespaces/${NS}/pods`, `POST /api/v1/namespaces/${NS}/secrets`, `GET /api/v1/namespaces/${NS}/pods/${podName}`]);
    const pod = api.calls[0]!.body as { metadata: Record<string, unknown>; spec: Record<string, unknown> & { containers: Array<Record<string, unknown>> } };
    const labels = {
      "app.kubernetes.io/name": "rollgate-sandbox",
      "app.kubernetes.io/managed-by": "rollgate",
      "rollgate.dev/task": "T_1.x",
      "rollgate.dev/worker": "worker-a",
    };
    expect(pod.metadata).toEqual({ name: podName, namespace: NS, labels: { ...labels, "rollgate.dev/pod": podName }, annotations: { "rollgate.dev/task-id": "T_1.x", "rollgate.dev/worker-name": "worker-a" } });
    expect(pod.spec).toEqual({
      restartPolicy: "Never",
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      // Never the node's network, PIDs or IPC: the NetworkPolicy (deploy/k8s) selects the pod by its app label.
      hostNetwork: false,
      hostPID: false,
      hostIPC: false,
      terminationGracePeriodSeconds: 0,
      serviceAccountName: "sandbox",
      nodeSelector: { pool: "rollouts" },
      activeDeadlineSeconds: 600 + 3600,
      containers: [
        {
          name: "sandbox",
          image: "python:3.12",
          command: ["sleep", "infinity"],
          workingDir: "/workspace",
          env: [{ name: "ROLLGATE_SESSION_TOKEN", valueFrom: { secretKeyRef: { name: `${podName}-session`, key: "token" } } }],
          resources: { limits: { cpu: "500m", memory: "1Gi" }, requests: { cpu: "500m", memory: "1Gi" } },
        },
      ],
    });
    expect(JSON.stringify(pod)).not.toContain(TOKEN);
    const secret = api.calls[1]!.body as { metadata: { name: string; labels: Record<string, string>; ownerReferences: unknown[] }; stringData: Record<string, string>; type: string };
    const created = api.pods.get(podName)!;
    expect(secret.metadata.name).toBe(`${podName}-session`);
    expect(secret.metadata.labels).toEqual(labels);
    expect(secret.metadata.ownerReferences).toEqual([{ apiVersion: "v1", kind: "Pod", name: podName, uid: created.obj.metadata.uid }]);
    expect(secret.stringData).toEqual({ token: TOKEN });
    expect(secret.type).toBe("Opaque");
    // The working directory was populated by exec + tar once the pod ran.
    expect(created.fs.get("/workspace/a.txt")).toBe("A");
    expect(created.fs.get("/workspace/src/b.py")).toBe("print(1)\n");
    expect(created.fs.get("/rollgate/home")).toBeNull();
    const untar = wsCalls()[0]!.query;
    expect(untar.getAll("command")).toEqual(["sh", "-c", expect.stringMatching(/^head -c \d+ \| tar -xf - -C \/$/)]);
    expect(untar.get("container")).toBe("sandbox");
    await sb.destroy();
  });

  it("without the token at create (today's rollout.ts), the pod is created at the first exec, with the token of that step's env and the HOME files written before", async () => {
    const rt = runtime();
    const sb = await rt.create("t-1", spec({ keep: false }));
    expect(api.calls).toHaveLength(0);
    await sb.writeHomeFiles({ ".config/opencode/opencode.json": '{"apiKey":"x"}' });
    expect(await sb.readFile("anything")).toBeNull();
    const r = await sb.exec(["echo", "hi"], opts());
    expect(r.exitCode).toBe(0);
    expect(r.stdoutTail).toBe("hi\n");
    const secret = api.calls.find((c) => c.path.endsWith("/secrets"))!.body as { stringData: Record<string, string> };
    expect(secret.stringData.token).toBe(TOKEN);
    const pod = [...api.pods.values()][0]!;
    expect(pod.fs.get("/rollgate/home/.config/opencode/opencode.json")).toBe('{"apiKey":"x"}');
    await sb.destroy();
    expect(api.pods.size).toBe(0);
  });

  it("an image that cannot be pulled is SandboxUnavailable (eager) or a spawnError (lazy), and the pod is deleted", async () => {
    api.pullFails = true;
    const rt = runtime();
    await expect(rt.create("t-1", spec(), { sessionToken: TOKEN })).rejects.toBeInstanceOf(SandboxUnavailable);
    expect(api.pods.size).toBe(0);
    expect(api.secrets.size).toBe(0);
    const sb = await rt.create("t-2", spec());
    const r = await sb.exec(["true"], opts());
    expect(r.spawnError).toMatch(/ImagePullBackOff/);
    await sb.destroy();
    expect(api.pods.size).toBe(0);
    expect(rt.slots.inUse).toBe(0);
  });
});

describe("kubernetes runtime: the network", () => {
  it("no runtime.egress: no policy of its own (the namespace's NetworkPolicy lets it reach the gateway and DNS only)", async () => {
    const sb = await runtime().create("t-sealed", spec(), { sessionToken: TOKEN });
    expect(api.calls.some((c) => c.path.includes("networkpolicies"))).toBe(false);
    expect(sb.sessionUrl).toBeNull();
    await sb.destroy();
  });

  it("runtime.egress: a NetworkPolicy of the pod's own allows exactly those CIDRs, never metadata, loopback or the worker's infrastructure, and goes with the pod", async () => {
    const rt = runtime({ egressDeny: ["10.0.0.7", "redis.rollgate.svc", "10.96.0.0/12"] });
    const sb = await rt.create("t-egress", spec({ egress: ["140.82.112.0/20", "151.101.0.223", "10.0.0.0/8", "169.254.169.254", "*"] }), { sessionToken: TOKEN });
    const podName = sb.describe().split("/")[1]!;
    const call = api.calls.find((c) => c.method === "POST" && c.path === `/apis/networking.k8s.io/v1/namespaces/${NS}/networkpolicies`)!;
    const created = api.pods.get(podName)!;
    expect(call.body).toEqual({
      apiVersion: "networking.k8s.io/v1",
      kind: "NetworkPolicy",
      metadata: {
        name: `${podName}-egress`,
        namespace: NS,
        labels: { "app.kubernetes.io/name": "rollgate-sandbox", "app.kubernetes.io/managed-by": "rollgate", "rollgate.dev/task": "t-egress", "rollgate.dev/worker": "worker-a" },
        ownerReferences: [{ apiVersion: "v1", kind: "Pod", name: podName, uid: created.obj.metadata.uid }],
      },
      spec: {
        podSelector: { matchLabels: { "rollgate.dev/pod": podName } },
        policyTypes: ["Egress"],
        egress: [
          {
            to: [
              { ipBlock: { cidr: "140.82.112.0/20" } },
              { ipBlock: { cidr: "151.101.0.223/32" } },
              { ipBlock: { cidr: "10.0.0.0/8", except: ["10.0.0.7/32", "10.96.0.0/12"] } },
              // 169.254.169.254 lies inside a denied range: dropped. "*" keeps the denials out.
              { ipBlock: { cidr: "0.0.0.0/0", except: ["169.254.0.0/16", "100.100.100.200/32", "127.0.0.0/8", "0.0.0.0/8", "10.0.0.7/32", "10.96.0.0/12"] } },
              { ipBlock: { cidr: "::/0", except: ["fe80::/10", "fd00:ec2::254/128", "::1/128", "::/128"] } },
            ],
          },
        ],
      },
    });
    expect(api.networkPolicies.has(`${podName}-egress`)).toBe(true);
    await sb.destroy();
    expect(api.networkPolicies.size).toBe(0);
  });

  it("a host-name egress rule is refused before any pod exists (a NetworkPolicy cannot name hosts)", async () => {
    await expect(runtime().create("t-host", spec({ egress: ["pypi.org"] }), { sessionToken: TOKEN })).rejects.toThrow(SandboxUnavailable);
    await expect(runtime().create("t-host", spec({ egress: ["*.github.com"] }), { sessionToken: TOKEN })).rejects.toThrow(/takes CIDRs, IPs or \* \(a NetworkPolicy cannot name hosts\): \*\.github\.com/);
    expect(api.calls).toEqual([]);
  });
});

describe("kubernetes runtime: steps", () => {
  it("runs the steps in order via the exec WebSocket with the documented agent environment; no token or instruction in any exec URL", async () => {
    const rt = runtime();
    const sb = await rt.create("t-1", spec(), { sessionToken: TOKEN });
    const steps = [["echo", "prepare"], ["printenv"], ["echo", "evaluate"]];
    const results = [];
    for (const argv of steps) results.push(await sb.exec(argv, opts()));
    const pod = [...api.pods.values()][0]!;
    expect(pod.execs.map((e) => e.argv)).toEqual(steps);
    expect(pod.execs.every((e) => e.cwd === "/workspace")).toBe(true);
    const stepExecs = wsCalls().slice(1);
    expect(stepExecs.map((c) => c.query.getAll("command").slice(4))).toEqual(steps);
    for (const c of stepExecs) {
      expect(c.query.getAll("command").slice(0, 4)).toEqual(["sh", "-c", expect.stringMatching(/^eval "\$\(head -c \d+\)"$/), "rollgate-step"]);
      expect(c.query.get("stdin")).toBe("true");
      expect(c.query.get("stdout")).toBe("true");
      expect(c.query.get("stderr")).toBe("true");
      expect(c.query.get("tty")).toBe("false");
    }
    for (const c of api.calls) {
      expect(decodeURIComponent(c.query.toString())).not.toContain(TOKEN);
      expect(decodeURIComponent(c.query.toString().replace(/\+/g, " "))).not.toContain("fix the bug");
    }
    const { PATH: _host, ...sixEnv } = env();
    expect(JSON.parse(results[1]!.stdoutTail)).toEqual({ ...sixEnv, PATH: "/usr/local/bin:/usr/bin:/bin", PYTHON_VERSION: "3.12", HOSTNAME: "pod" });
    await sb.destroy();
  });

  it("maps the channel frames and the status into RunResult; a missing program is a spawnError", async () => {
    const rt = runtime();
    const sb = await rt.create("t-1", spec(), { sessionToken: TOKEN });
    const chunks: string[] = [];
    const r = await sb.exec(["noisy"], { ...opts(), onOutput: (b) => chunks.push(b.toString()) });
    expect(r).toMatchObject({ exitCode: 3, signal: null, timedOut: false, aborted: false, spawnError: null });
    expect(r.logTail).toBe("to stdout\nto stderr\nmore stdout\n");
    expect(r.stdoutTail).toBe("to stdout\nmore stdout\n");
    expect(chunks.join("")).toBe(r.logTail);
    expect((await sb.exec(["true"], opts())).exitCode).toBe(0);
    const missing = await sb.exec(["claude"], opts());
    expect(missing.exitCode).toBeNull();
    expect(missing.spawnError).toBe("rollgate-sandbox: cannot start claude: not found");
    await sb.destroy();
  });

  it("readFile reads only a regular file of at most 32 MiB: a FIFO or a huge file the agent left reads as absent, and at once", async () => {
    const rt = runtime();
    const sb = await rt.create("t-fifo", spec(), { sessionToken: TOKEN });
    await sb.exec(["mkfifo", "reward.txt"], opts());
    await sb.exec(["fill", "huge.txt", String(MAX_READ_BYTES + 1)], opts());
    // cat would wait on the FIFO for a writer until the pod's deadline, and read the whole huge file into the worker.
    expect(await sb.readFile("reward.txt")).toBeNull();
    expect(await sb.readFile("huge.txt")).toBeNull();
    await sb.destroy();
  });

  it("readFile runs the read script in the pod: the file, or null when missing or outside the working directory", async () => {
    const rt = runtime();
    const sb = await rt.create("t-1", spec({ files: { "given.txt": "from the task" } }), { sessionToken: TOKEN });
    await sb.exec(["write", "answer.txt", "42"], opts());
    expect(await sb.readFile("answer.txt")).toBe("42");
    expect(await sb.readFile("given.txt")).toBe("from the task");
    expect(await sb.readFile("missing.txt")).toBeNull();
    expect(await sb.readFile("../etc/passwd")).toBeNull();
    expect(wsCalls().filter((c) => c.query.getAll("command")[2] === READ_FILE_SCRIPT).map((c) => c.query.getAll("command"))).toEqual([
      ["sh", "-c", READ_FILE_SCRIPT, "sh", "/workspace/answer.txt"],
      ["sh", "-c", READ_FILE_SCRIPT, "sh", "/workspace/given.txt"],
      ["sh", "-c", READ_FILE_SCRIPT, "sh", "/workspace/missing.txt"],
    ]);
    await sb.destroy();
  });
});

describe("kubernetes runtime: what the agent leaves running", () => {
  it("does not outlive stopLeftovers: the evaluator reads what the grader wrote, not what the agent's daemon keeps writing", async () => {
    const rt = runtime();
    const sb = await rt.create("t-daemon", spec(), { sessionToken: TOKEN });
    expect((await sb.exec(["daemon", "reward.json", '{"reward": 1}'], opts())).exitCode).toBe(0);
    await sb.stopLeftovers?.();
    const ev = await evaluate(EvaluatorSpec.parse({ kind: "reward_file", command: ["write", "reward.json", '{"reward": 0}'] }), { sandbox: sb, env: env(), summary: () => ({}) });
    expect(ev).toMatchObject({ kind: "scored", reward: 0 });
    // A daemon still alive would have rewritten it many times over by now (it writes every 5 ms).
    await new Promise((r) => setTimeout(r, 100));
    expect(await sb.readFile("reward.json")).toBe('{"reward": 0}');
    await sb.destroy();
  });
});

describe("kubernetes runtime: the step script, run by the real sh", () => {
  it("exports exactly the step env over the image's, takes the token from the pod env, hides the token and KUBERNETES_*, cds, and gives the program no stdin", () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "rg-k8s-script-"));
    try {
      const stepEnv = { ...env(), WEIRD: "a'b\"c $HOME `x` \\n", "NOT.A.NAME": "skipped" };
      const script = stepScript(stepEnv, { workdir: dir, token: TOKEN, workerPath: WORKER_PATH });
      expect(script).not.toContain(TOKEN);
      const probe = "process.stdout.write(JSON.stringify({env: process.env, cwd: process.cwd(), stdin: require('fs').readFileSync(0, 'utf8')}))";
      const argv = stepCommand(Buffer.byteLength(script), [process.execPath, "-e", probe]);
      const podEnv = { PATH: process.env.PATH!, IMAGE_VAR: "from-image", ROLLGATE_SESSION_TOKEN: TOKEN, KUBERNETES_SERVICE_HOST: "10.96.0.1", KUBERNETES_PORT: "tcp://10.96.0.1:443" };
      const r = spawnSync(argv[0]!, argv.slice(1), { input: script + "MORE STDIN THE PROGRAM MUST NOT SEE", env: podEnv });
      expect(r.stderr.toString()).toBe("");
      const seen = JSON.parse(r.stdout.toString()) as { env: Record<string, string>; cwd: string; stdin: string };
      const { PATH: _host, ...sixEnv } = env();
      const { PWD: _pwd, SHLVL: _shlvl, _: _underscore, ...rest } = seen.env;
      expect(rest).toEqual({ ...sixEnv, WEIRD: stepEnv.WEIRD, PATH: process.env.PATH, IMAGE_VAR: "from-image" });
      expect(seen.env.OPENAI_API_KEY).toBe(TOKEN);
      expect(seen.cwd).toBe(dir);
      expect(seen.stdin).toBe("");
      const missing = stepCommand(Buffer.byteLength(script), ["no-such-agent-binary"]);
      const m = spawnSync(missing[0]!, missing.slice(1), { input: script, env: podEnv });
      expect(m.status).toBe(127);
      expect(m.stderr.toString()).toBe("rollgate-sandbox: cannot start no-such-agent-binary: not found\n");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("the file read script: a regular file's bytes; a FIFO, a device behind a link and a missing file exit 3 at once; a huge file stops one byte past the limit", () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "rg-k8s-read-"));
    const read = (name: string) => spawnSync("sh", ["-c", READ_FILE_SCRIPT, "sh", path.join(dir, name)], { timeout: 10_000, maxBuffer: MAX_READ_BYTES + 1024 });
    try {
      writeFileSync(path.join(dir, "answer.txt"), "42\n");
      expect(spawnSync("mkfifo", [path.join(dir, "fifo")]).status).toBe(0);
      symlinkSync("/dev/zero", path.join(dir, "zero"));
      writeFileSync(path.join(dir, "sparse"), "");
      truncateSync(path.join(dir, "sparse"), MAX_READ_BYTES + 4096);
      const ok = read("answer.txt");
      expect([ok.status, ok.stdout.toString()]).toEqual([0, "42\n"]);
      for (const name of ["fifo", "zero", "missing"]) {
        const r = read(name);
        expect(r.error).toBeUndefined(); // not killed by the timeout: it did not block
        expect([name, r.status, r.stdout.length]).toEqual([name, 3, 0]);
      }
      const big = read("sparse");
      expect([big.status, big.stdout.length]).toEqual([0, MAX_READ_BYTES + 1]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("tokenFromEnv takes the value the §6 key variables share", () => {
    expect(tokenFromEnv(env())).toBe(TOKEN);
    expect(tokenFromEnv(env({ OPENAI_API_KEY: "the-task's-own" }))).toBe(TOKEN);
    expect(tokenFromEnv({})).toBe("");
  });
});

describe("kubernetes runtime: cleanup", () => {
  it("deletes the pod (grace 0) and its Secret after success, and again is a no-op", async () => {
    const rt = runtime();
    const sb = await rt.create("t-1", spec(), { sessionToken: TOKEN });
    await sb.exec(["true"], opts());
    await sb.destroy();
    await sb.destroy();
    const dels = api.calls.filter((c) => c.method === "DELETE");
    expect(dels.map((c) => c.path)).toEqual([expect.stringMatching(new RegExp(`^/api/v1/namespaces/${NS}/pods/rg-t-1-`)), expect.stringMatching(/\/secrets\/rg-t-1-[0-9a-f]{6}-session$/)]);
    expect(dels[0]!.query.get("gracePeriodSeconds")).toBe("0");
    expect(api.pods.size + api.secrets.size).toBe(0);
    expect(rt.slots.inUse).toBe(0);
  });

  it("deletes them after a failed step", async () => {
    const rt = runtime();
    const sb = await rt.create("t-1", spec(), { sessionToken: TOKEN });
    expect((await sb.exec(["false"], opts())).exitCode).toBe(1);
    await sb.destroy();
    expect(api.pods.size + api.secrets.size).toBe(0);
  });

  it("a timeout runs kill -9 -1 in the pod (the step and all it started), the pod stays usable, destroy deletes it", async () => {
    const rt = runtime();
    const sb = await rt.create("t-1", spec(), { sessionToken: TOKEN });
    const t0 = Date.now();
    const r = await sb.exec(["sleep", "30"], opts({ timeoutMs: 200 }));
    expect(Date.now() - t0).toBeLessThan(3_000);
    expect(r).toMatchObject({ timedOut: true, aborted: false, exitCode: null, signal: "SIGKILL" });
    expect(r.logTail).toBe("sleeping\n");
    expect(wsCalls().some((c) => c.query.getAll("command").join(" ") === "sh -c kill -9 -1")).toBe(true);
    expect([...api.pods.values()][0]!.running.size).toBe(0);
    expect((await sb.exec(["echo", "evaluator"], opts())).exitCode).toBe(0);
    await sb.destroy();
    expect(api.pods.size + api.secrets.size).toBe(0);
  });

  it("a cancel (abort signal) kills the step the same way; destroy deletes the pod", async () => {
    const rt = runtime();
    const sb = await rt.create("t-1", spec(), { sessionToken: TOKEN });
    const ac = new AbortController();
    setTimeout(() => ac.abort("cancelled"), 150);
    const r = await sb.exec(["sleep", "30"], opts({ signal: ac.signal }));
    expect(r).toMatchObject({ aborted: true, timedOut: false, exitCode: null, signal: "SIGKILL" });
    expect([...api.pods.values()][0]!.running.size).toBe(0);
    await sb.destroy();
    expect(api.pods.size + api.secrets.size).toBe(0);
  });

  it("a cancel while the pod is still starting ends the step and destroy deletes the pod", async () => {
    api.pendingReads = 1_000_000;
    const rt = runtime();
    const sb = await rt.create("t-1", spec());
    const ac = new AbortController();
    setTimeout(() => ac.abort("cancelled"), 100);
    const r = await sb.exec(["true"], opts({ signal: ac.signal }));
    expect(r.aborted).toBe(true);
    await sb.destroy();
    expect(api.pods.size + api.secrets.size).toBe(0);
  });

  it("worker crash: the start-up sweep deletes this worker's pods and Secrets and finished sandbox pods, not kept ones or other workers' live ones", async () => {
    const base = { "app.kubernetes.io/name": "rollgate-sandbox" };
    api.addLeftoverPod("mine", { ...base, "rollgate.dev/worker": "worker-a" });
    api.addLeftoverPod("mine-kept", { ...base, "rollgate.dev/worker": "worker-a", "rollgate.dev/keep": "true" });
    api.addLeftoverPod("theirs", { ...base, "rollgate.dev/worker": "worker-b" });
    api.addLeftoverPod("theirs-failed", { ...base, "rollgate.dev/worker": "worker-b" }, "Failed");
    api.addLeftoverPod("not-ours", { app: "redis" }, "Failed");
    api.secrets.set("mine-session", { metadata: { name: "mine-session", labels: { ...base, "rollgate.dev/worker": "worker-a" } } });
    const rt = runtime();
    expect(await rt.sweep()).toBe(2);
    expect([...api.pods.keys()].sort()).toEqual(["mine-kept", "not-ours", "theirs"]);
    expect(api.secrets.size).toBe(0);
    const lists = api.calls.filter((c) => c.method === "GET").map((c) => [c.query.get("labelSelector"), c.query.get("fieldSelector")]);
    expect(lists).toContainEqual(["app.kubernetes.io/name=rollgate-sandbox,rollgate.dev/worker=worker-a,rollgate.dev/keep!=true", null]);
  });
});

describe("kubernetes runtime: the pod bound", () => {
  it("with ROLLGATE_K8S_MAX_PODS=1 a second create waits until the first sandbox is destroyed", async () => {
    const rt = runtime({ maxPods: 1 });
    const first = await rt.create("t-1", spec(), { sessionToken: TOKEN });
    let secondReady = false;
    const second = rt.create("t-2", spec(), { sessionToken: TOKEN }).then((s) => {
      secondReady = true;
      return s;
    });
    await new Promise((r) => setTimeout(r, 150));
    expect(secondReady).toBe(false);
    expect(api.pods.size).toBe(1);
    expect(rt.slots.queued).toBe(1);
    await first.destroy();
    const s2 = await second;
    expect(api.pods.size).toBe(1);
    expect(s2.describe()).toContain("rg-t-2-");
    await s2.destroy();
    expect(rt.slots.inUse).toBe(0);
  });
});
