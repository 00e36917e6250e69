import { randomBytes } from "node:crypto";
import { BlockList, isIP } from "node:net";
import { PassThrough, Writable } from "node:stream";
import { CoreV1Api, Exec, type KubeConfig, NetworkingV1Api, type V1NetworkPolicy, type V1Pod, type V1Status } from "@kubernetes/client-node";
import type { LostCalls, RuntimeSpec } from "@rollgate/protocol";
import {
  CANNOT_START,
  CONTAINER_HOME,
  CappedRead,
  CONTAINER_TMP,
  type ContainerRuntimeOptions,
  DEFAULT_WORKDIR,
  IDLE_COMMAND,
  Semaphore,
  StepOutput,
  cpuQuantity,
  dnsName,
  insideWorkdir,
  labelValue,
  memoryQuantity,
  READ_FILE_SCRIPT,
  sleep,
  stepResult,
  watchStep,
} from "./container-common.js";
import { SANDBOX_ALWAYS_DENIED } from "../egress.js";
import { filesUnder, layoutEntries } from "./docker-runtime.js";
import { SandboxUnavailable } from "./local-runtime.js";
import type { RunResult } from "./process.js";
import { NO_LOST_CALLS, type CreateOptions, type ExecOptions, type Sandbox, type SandboxRuntime } from "./runtime.js";
import { type TarEntry, buildTar } from "./tar.js";

/**
 * `runtime.kind: "kubernetes"`: one pod per rollout in the worker's sandbox namespace
 * (ROLLGATE_K8S_NAMESPACE), through the official client (@kubernetes/client-node).
 *
 * Pod: the task's image running `sleep infinity` in `runtime.workdir` (default /workspace),
 * `restartPolicy: Never`, no service-account token mounted, no service links, resources
 * requests = limits from `runtime.resources`, `runtime.service_account` and `runtime.node_selector`
 * when given, `activeDeadlineSeconds` (the rollout's timeout plus an hour) when the worker says it,
 * and a NetworkPolicy-friendly label set: `app.kubernetes.io/name: rollgate-sandbox`,
 * `app.kubernetes.io/managed-by: rollgate`, `rollgate.dev/task`, `rollgate.dev/worker` (label-safe
 * forms; the full ids are in annotations).
 *
 * The session token: a per-pod Secret `<pod>-session` (key `token`, owner reference → the Pod, so
 * deleting the pod deletes it) and the pod's only env var `ROLLGATE_SESSION_TOKEN` from it via
 * `valueFrom.secretKeyRef`. No token literal is in the pod spec, in an exec URL or on stdin. The
 * Exec API cannot set an environment, so each step runs as
 *   sh -c 'eval "$(head -c N)"' rollgate-step <argv…>
 * with a short script on the exec's stdin that exports the step's agent environment (docs/agent-environment.md#environment-variables) (a value
 * equal to the session token is written as "$T", read from the pod env), unsets the token and the
 * KUBERNETES_* variables, cds to the working directory and `exec`s the argv with stdin at
 * /dev/null. The image's own ENV stays (as with `docker exec`); a PATH equal to the worker's
 * local sandbox PATH is dropped so the image's PATH applies.
 *
 * The pod needs the token at creation, so it is created when the runtime learns it: in `create`
 * when given `opts.sessionToken`, otherwise at the first exec (from that step's §6 key variables).
 *
 * Files: `runtime.files`, HOME and TMPDIR are written by one exec of `head -c N | tar -x -C /` with
 * a tar on stdin (like `kubectl cp`); the image needs `sh`, `head`, `tar`, `cat` and `sleep`
 * (busybox has them all).
 *
 * Timeouts and cancels: closing an exec stream does not stop its process, so the worker runs
 * `kill -9 -1` in the pod (every process but PID 1 and the killer: the step and all it started)
 * and the pod stays usable for a following step; if that fails the pod is deleted.
 *
 * Network: every pod is sealed by the NetworkPolicy of deploy/k8s, which selects the
 * `app.kubernetes.io/name: rollgate-sandbox` label: it reaches the gateway's port and DNS only
 * (and nothing reaches it). The pod spec says hostNetwork/hostPID/hostIPC false outright.
 * `runtime.egress` adds a NetworkPolicy of the pod's own (`<pod>-egress`, selecting its
 * `rollgate.dev/pod` label, owner → the Pod) allowing the task's CIDRs and IPs (`*`: any
 * address), minus link-local / metadata / loopback and the worker's infrastructure addresses
 * (ipBlock `except`). A NetworkPolicy cannot name hosts: a host-name rule is refused
 * (SandboxUnavailable) before the pod is created.
 *
 * Cleanup: `destroy` deletes the pod (grace 0) and its Secret whatever happened (`runtime.keep`:
 * the pod stays, labelled `rollgate.dev/keep=true`). `sweep()` on worker start deletes this
 * worker's leftover pods and Secrets by label, and finished (Failed/Succeeded) sandbox pods of any
 * worker. At most `maxPods` pods exist per worker: `create` waits for a slot.
 */

export const SANDBOX_APP = "rollgate-sandbox";
const CONTAINER = "sandbox";
const TOKEN_ENV = "ROLLGATE_SESSION_TOKEN";
/** The agent environment's variables that carry the session token. */
const TOKEN_VARS = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"];
/** What Kubernetes injects into every container and a sandboxed step must not see. */
const K8S_VARS = [
  "KUBERNETES_SERVICE_HOST",
  "KUBERNETES_SERVICE_PORT",
  "KUBERNETES_SERVICE_PORT_HTTPS",
  "KUBERNETES_PORT",
  "KUBERNETES_PORT_443_TCP",
  "KUBERNETES_PORT_443_TCP_PROTO",
  "KUBERNETES_PORT_443_TCP_PORT",
  "KUBERNETES_PORT_443_TCP_ADDR",
];
const FAIL_FAST_REASONS = new Set(["ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerError"]);
const KILL_COMMAND = ["sh", "-c", "kill -9 -1"];
const WAIT_AFTER_KILL_MS = 5_000;
const DEADLINE_MARGIN_S = 3600;

export interface KubernetesRuntimeOptions extends ContainerRuntimeOptions {
  kc: KubeConfig;
  /** Destinations no sandbox reaches whatever its `runtime.egress` (the worker's infrastructure); only addresses count here. */
  egressDeny?: string[];
  namespace: string;
  /** Pods this worker keeps at once (ROLLGATE_K8S_MAX_PODS); more creates wait. */
  maxPods: number;
  /** How long a pod may take to be Running (ROLLGATE_K8S_START_TIMEOUT_S). */
  startTimeoutMs: number;
  /** How often a starting pod is polled (default 500 ms). */
  pollMs?: number;
  log?: { warn: (obj: object, msg: string) => void };
}

function codeOf(err: unknown): number | undefined {
  const c = (err as { code?: unknown; statusCode?: unknown }).code ?? (err as { statusCode?: unknown }).statusCode;
  return typeof c === "number" ? c : undefined;
}

/** Single-quotes a string for sh. */
export function shq(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** The session token of a step's environment: the value most of the §6 key variables share. */
export function tokenFromEnv(env: Record<string, string>): string {
  const counts = new Map<string, number>();
  for (const k of TOKEN_VARS) {
    const v = env[k];
    if (v) counts.set(v, (counts.get(v) ?? 0) + 1);
  }
  return [...counts.entries()].sort((a, b) => b[1] - a[1])[0]?.[0] ?? "";
}

/**
 * The script a step's exec reads from its stdin (see the module comment): it exports exactly the
 * step's environment on top of the image's, with the session token taken from the pod env.
 */
export function stepScript(env: Record<string, string>, o: { workdir: string; token: string; workerPath?: string }): string {
  const lines = [`T=$${TOKEN_ENV}`, `unset ${TOKEN_ENV} ${K8S_VARS.join(" ")}`];
  for (const [k, v] of Object.entries(env)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) continue; // not a name sh can export
    if (k === "PATH" && o.workerPath !== undefined && v === o.workerPath) continue;
    lines.push(o.token && v === o.token ? `export ${k}="$T"` : `export ${k}=${shq(v)}`);
  }
  lines.push(
    "unset T",
    `cd ${shq(o.workdir)} || { echo ${shq(`${CANNOT_START}: no working directory ${o.workdir}`)} >&2; exit 127; }`,
    "unset OLDPWD",
    `command -v "$1" >/dev/null 2>&1 || { printf '%s %s: not found\\n' ${shq(CANNOT_START)} "$1" >&2; exit 127; }`,
    'exec "$@" </dev/null',
  );
  return lines.join("\n") + "\n";
}

/** The exec argv that runs `argv` with a step script of `bytes` bytes on stdin. */
export function stepCommand(bytes: number, argv: string[]): string[] {
  return ["sh", "-c", `eval "$(head -c ${bytes})"`, "rollgate-step", ...argv];
}

/** The exec argv that unpacks a tar of `bytes` bytes from stdin at /. */
export function untarCommand(bytes: number): string[] {
  return ["sh", "-c", `head -c ${bytes} | tar -xf - -C /`];
}

/** A V1Status from the exec stream → an exit code, or the reason the program never ran. */
function exitOf(s: V1Status | null): { exitCode: number | null; spawnError: string | null } {
  if (!s) return { exitCode: null, spawnError: "the exec stream closed without a status" };
  if (s.status === "Success") return { exitCode: 0, spawnError: null };
  const cause = s.details?.causes?.find((c) => c.reason === "ExitCode");
  if (s.reason === "NonZeroExitCode" && cause?.message !== undefined) return { exitCode: Number(cause.message), spawnError: null };
  return { exitCode: null, spawnError: s.message ?? "exec failed" };
}

function parseCidr(c: string): { address: string; prefix: number; type: "ipv4" | "ipv6" } | null {
  const [address, bits] = c.split("/");
  const family = isIP(address ?? "");
  if (!family) return null;
  const max = family === 6 ? 128 : 32;
  const prefix = bits === undefined ? max : Number(bits);
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > max) return null;
  return { address: address!, prefix, type: family === 6 ? "ipv6" : "ipv4" };
}

/** Whether `inner` lies inside `outer` (both CIDRs of one family). */
function cidrInside(inner: ReturnType<typeof parseCidr> & object, outer: ReturnType<typeof parseCidr> & object): boolean {
  if (inner.type !== outer.type || inner.prefix < outer.prefix) return false;
  const b = new BlockList();
  b.addSubnet(outer.address, outer.prefix, outer.type);
  return b.check(inner.address, inner.type);
}

/**
 * The ipBlocks of a pod's egress NetworkPolicy for a task's `runtime.egress` (see the module
 * comment): each allowed CIDR/IP (`*`: 0.0.0.0/0 and ::/0) with the denied ranges inside it as
 * `except`; one that lies inside a denied range is dropped. A host-name rule is a
 * SandboxUnavailable: a NetworkPolicy cannot name hosts.
 */
export function egressIpBlocks(allow: string[], deny: string[] = []): { cidr: string; except?: string[] }[] {
  const denied = [...SANDBOX_ALWAYS_DENIED, ...deny].map(parseCidr).filter((d): d is NonNullable<typeof d> => d !== null);
  const blocks: { cidr: string; except?: string[] }[] = [];
  for (const rule of allow) {
    const cidrs = rule === "*" ? ["0.0.0.0/0", "::/0"] : [rule];
    for (const c of cidrs) {
      const block = parseCidr(c);
      if (!block) throw new SandboxUnavailable(`runtime.egress on kubernetes takes CIDRs, IPs or * (a NetworkPolicy cannot name hosts): ${rule}`);
      if (denied.some((d) => cidrInside(block, d))) continue;
      const except = denied.filter((d) => cidrInside(d, block)).map((d) => `${d.address}/${d.prefix}`);
      blocks.push({ cidr: `${block.address}/${block.prefix}`, ...(except.length ? { except: [...new Set(except)] } : {}) });
    }
  }
  return blocks;
}

export class KubernetesRuntime implements SandboxRuntime {
  readonly core: CoreV1Api;
  readonly networking: NetworkingV1Api;
  readonly exec: Exec;
  readonly slots: Semaphore;
  constructor(readonly o: KubernetesRuntimeOptions) {
    this.core = o.kc.makeApiClient(CoreV1Api);
    this.networking = o.kc.makeApiClient(NetworkingV1Api);
    this.exec = new Exec(o.kc);
    this.slots = new Semaphore(o.maxPods);
  }

  labels(taskId: string, keep: boolean): Record<string, string> {
    return {
      "app.kubernetes.io/name": SANDBOX_APP,
      "app.kubernetes.io/managed-by": "rollgate",
      "rollgate.dev/task": labelValue(taskId),
      "rollgate.dev/worker": labelValue(this.o.workerName),
      ...(keep ? { "rollgate.dev/keep": "true" } : {}),
    };
  }

  async create(taskId: string, spec: RuntimeSpec, opts: CreateOptions = {}): Promise<Sandbox> {
    if (!spec.image) throw new SandboxUnavailable("runtime.kind kubernetes needs runtime.image");
    // A rule a NetworkPolicy cannot express fails now, before any pod exists.
    if (spec.egress.length > 0) egressIpBlocks(spec.egress, this.o.egressDeny);
    const release = await this.slots.acquire();
    const sandbox = new PodSandbox(this, taskId, spec, opts, release);
    if (opts.sessionToken !== undefined) {
      try {
        await sandbox.start(opts.sessionToken);
      } catch (err) {
        await sandbox.destroy();
        throw err;
      }
    }
    return sandbox;
  }

  /** Deletes this worker's leftover pods and Secrets (not kept ones), and finished sandbox pods of any worker. */
  async sweep(): Promise<number> {
    const ns = this.o.namespace;
    const mine = `app.kubernetes.io/name=${SANDBOX_APP},rollgate.dev/worker=${labelValue(this.o.workerName)},rollgate.dev/keep!=true`;
    const pods = await this.core.listNamespacedPod({ namespace: ns, labelSelector: mine });
    const finished = await this.core.listNamespacedPod({
      namespace: ns,
      labelSelector: `app.kubernetes.io/name=${SANDBOX_APP},rollgate.dev/keep!=true`,
      fieldSelector: "status.phase!=Running,status.phase!=Pending,status.phase!=Unknown",
    });
    const names = new Set([...pods.items, ...finished.items].map((p) => p.metadata?.name).filter((n): n is string => !!n));
    let removed = 0;
    for (const name of names) {
      if (await this.deletePod(name)) removed++;
    }
    const secrets = await this.core.listNamespacedSecret({ namespace: ns, labelSelector: mine });
    for (const s of secrets.items) if (s.metadata?.name) await this.deleteSecret(s.metadata.name);
    return removed;
  }

  async deletePod(name: string): Promise<boolean> {
    try {
      await this.core.deleteNamespacedPod({ name, namespace: this.o.namespace, gracePeriodSeconds: 0 });
      return true;
    } catch (err) {
      if (codeOf(err) !== 404) this.o.log?.warn({ pod: name, err: (err as Error).message }, "cannot delete a sandbox pod (the start-up sweep will)");
      return false;
    }
  }

  async deleteSecret(name: string): Promise<void> {
    try {
      await this.core.deleteNamespacedSecret({ name, namespace: this.o.namespace });
    } catch (err) {
      if (codeOf(err) !== 404) this.o.log?.warn({ secret: name, err: (err as Error).message }, "cannot delete a sandbox Secret (its pod owns it)");
    }
  }
}

interface ExecEnd {
  status: V1Status | null;
}

class PodSandbox implements Sandbox {
  readonly workdir: string;
  readonly home = CONTAINER_HOME;
  readonly tmp = CONTAINER_TMP;
  /** Pods reach the gateway's session URL themselves (the NetworkPolicy lets them reach nothing else). */
  readonly sessionUrl = null;
  readonly podName: string;
  readonly secretName: string;
  private token = "";
  private starting: Promise<void> | null = null;
  private ready = false;
  /** destroy() was called. */
  private closed = false;
  /** The pod had to be deleted (a kill that could not run): later steps cannot run. */
  private dead = false;
  /** HOME files written before the pod exists; they go in with the working directory. */
  private pendingHome: Record<string, string> = {};

  constructor(
    private readonly rt: KubernetesRuntime,
    private readonly taskId: string,
    private readonly spec: RuntimeSpec,
    private readonly opts: CreateOptions,
    private readonly release: () => void,
  ) {
    this.workdir = spec.workdir ?? DEFAULT_WORKDIR;
    this.podName = `rg-${dnsName(taskId, 40)}-${randomBytes(3).toString("hex")}`;
    this.secretName = `${this.podName}-session`;
  }

  /** The pod as documented in the module comment. */
  podSpec(): V1Pod {
    const r = this.spec.resources;
    const limits: Record<string, string> = {
      ...(r?.cpu !== undefined ? { cpu: cpuQuantity(r.cpu) } : {}),
      ...(r?.memory !== undefined ? { memory: memoryQuantity(r.memory) } : {}),
    };
    return {
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        name: this.podName,
        namespace: this.rt.o.namespace,
        labels: { ...this.rt.labels(this.taskId, this.spec.keep), "rollgate.dev/pod": this.podName },
        annotations: { "rollgate.dev/task-id": this.taskId, "rollgate.dev/worker-name": this.rt.o.workerName },
      },
      spec: {
        restartPolicy: "Never",
        automountServiceAccountToken: false,
        enableServiceLinks: false,
        hostNetwork: false,
        hostPID: false,
        hostIPC: false,
        terminationGracePeriodSeconds: 0,
        ...(this.spec.service_account ? { serviceAccountName: this.spec.service_account } : {}),
        ...(this.spec.node_selector ? { nodeSelector: this.spec.node_selector } : {}),
        ...(this.opts.timeoutS ? { activeDeadlineSeconds: Math.ceil(this.opts.timeoutS) + DEADLINE_MARGIN_S } : {}),
        containers: [
          {
            name: CONTAINER,
            image: this.spec.image!,
            command: IDLE_COMMAND,
            workingDir: this.workdir,
            env: [{ name: TOKEN_ENV, valueFrom: { secretKeyRef: { name: this.secretName, key: "token" } } }],
            ...(Object.keys(limits).length ? { resources: { limits, requests: limits } } : {}),
          },
        ],
      },
    };
  }

  /** The pod's own egress NetworkPolicy for `runtime.egress` (see the module comment), owned by the pod. */
  egressPolicy(podUid: string): V1NetworkPolicy {
    return {
      apiVersion: "networking.k8s.io/v1",
      kind: "NetworkPolicy",
      metadata: {
        name: `${this.podName}-egress`,
        namespace: this.rt.o.namespace,
        labels: this.rt.labels(this.taskId, this.spec.keep),
        ownerReferences: [{ apiVersion: "v1", kind: "Pod", name: this.podName, uid: podUid }],
      },
      spec: {
        podSelector: { matchLabels: { "rollgate.dev/pod": this.podName } },
        policyTypes: ["Egress"],
        egress: [{ to: egressIpBlocks(this.spec.egress, this.rt.o.egressDeny).map((ipBlock) => ({ ipBlock })) }],
      },
    };
  }

  /** Creates the pod and its Secret, waits for Running, and copies the files in (once). */
  start(token: string): Promise<void> {
    if (!this.starting) {
      this.token = token;
      this.starting = this.doStart();
    }
    return this.starting;
  }

  private async doStart() {
    const ns = this.rt.o.namespace;
    const pod = await this.rt.core.createNamespacedPod({ namespace: ns, body: this.podSpec() });
    try {
      await this.rt.core.createNamespacedSecret({
        namespace: ns,
        body: {
          apiVersion: "v1",
          kind: "Secret",
          type: "Opaque",
          metadata: {
            name: this.secretName,
            namespace: ns,
            labels: this.rt.labels(this.taskId, this.spec.keep),
            ownerReferences: [{ apiVersion: "v1", kind: "Pod", name: this.podName, uid: pod.metadata!.uid! }],
          },
          stringData: { token: this.token },
        },
      });
      if (this.spec.egress.length > 0) await this.rt.networking.createNamespacedNetworkPolicy({ namespace: ns, body: this.egressPolicy(pod.metadata!.uid!) });
      await this.waitRunning();
      const entries: TarEntry[] = [...layoutEntries(this.workdir, this.spec.files), ...filesUnder(this.home, this.pendingHome)];
      this.pendingHome = {};
      await this.upload(entries);
      this.ready = true;
    } catch (err) {
      await this.rt.deletePod(this.podName);
      throw err;
    }
  }

  private async waitRunning() {
    const deadline = Date.now() + this.rt.o.startTimeoutMs;
    for (;;) {
      if (this.closed) throw new Error("the sandbox was destroyed while its pod was starting");
      const pod = await this.rt.core.readNamespacedPod({ name: this.podName, namespace: this.rt.o.namespace });
      const phase = pod.status?.phase;
      const cs = pod.status?.containerStatuses?.find((c) => c.name === CONTAINER);
      if (phase === "Running" && cs?.state?.running) return;
      if (phase === "Failed" || phase === "Succeeded") {
        throw new SandboxUnavailable(`sandbox pod ${this.podName} ended (${phase}): ${pod.status?.reason ?? ""} ${pod.status?.message ?? ""}`.trim());
      }
      const waiting = cs?.state?.waiting;
      if (waiting?.reason && FAIL_FAST_REASONS.has(waiting.reason)) {
        throw new SandboxUnavailable(`sandbox pod ${this.podName} cannot start: ${waiting.reason}: ${waiting.message ?? ""}`.trim());
      }
      if (Date.now() > deadline) {
        // Not the task's fault (a full cluster, a slow pull): an infrastructure error, retried.
        throw new Error(`sandbox pod ${this.podName} not Running after ${this.rt.o.startTimeoutMs} ms (phase ${phase ?? "?"}${waiting?.reason ? `, ${waiting.reason}` : ""})`);
      }
      await sleep(this.rt.o.pollMs ?? 500);
    }
  }

  /** One exec: argv, optional stdin bytes (the stream stays open: `head -c` reads exactly them). */
  private async run(command: string[], stdinData: Buffer | null, onOut: (b: Buffer) => void, onErr: (b: Buffer) => void, onSocket?: (close: () => void) => void): Promise<ExecEnd> {
    const sink = (f: (b: Buffer) => void) =>
      new Writable({
        write(chunk: Buffer, _enc, cb) {
          f(chunk);
          cb();
        },
      });
    let stdin: PassThrough | null = null;
    if (stdinData) {
      stdin = new PassThrough();
      stdin.write(stdinData);
    }
    return new Promise<ExecEnd>((resolve, reject) => {
      let status: V1Status | null = null;
      let settled = false;
      const done = () => {
        if (settled) return;
        settled = true;
        resolve({ status });
      };
      this.rt.exec
        .exec(this.rt.o.namespace, this.podName, CONTAINER, command, sink(onOut), sink(onErr), stdin, false, (s) => {
          status = s;
          done();
        })
        .then((ws) => {
          ws.addEventListener("close", done);
          onSocket?.(() => ws.close());
        }, reject);
    });
  }

  private async upload(entries: TarEntry[]) {
    const tar = buildTar(entries);
    let log = "";
    const collect = (b: Buffer) => (log = (log + b.toString("utf8")).slice(-4096));
    const end = await this.run(untarCommand(tar.length), tar, collect, collect);
    const r = exitOf(end.status);
    if (r.exitCode !== 0) {
      const why = `cannot copy files into sandbox pod ${this.podName}: ${r.spawnError ?? `exit ${r.exitCode}`} ${log.trim()}`.trim();
      // An image without sh/head/tar will never work.
      if (r.exitCode === 126 || r.exitCode === 127) throw new SandboxUnavailable(why);
      throw new Error(why);
    }
  }

  /** Kills every process of the pod but PID 1 (timeout/cancel); deletes the pod when that fails. */
  private async killAll(): Promise<void> {
    try {
      const end = await Promise.race([
        this.run(KILL_COMMAND, null, () => undefined, () => undefined),
        sleep(10_000).then(() => null),
      ]);
      if (end && exitOf(end.status).exitCode === 0) return;
    } catch {
      // fall through to deleting the pod
    }
    this.ready = false;
    this.dead = true;
    await this.rt.deletePod(this.podName);
  }

  async exec(argv: string[], o: ExecOptions): Promise<RunResult> {
    const started = Date.now();
    const output = new StepOutput(o.onOutput);
    if (this.closed || this.dead) {
      return stepResult({ exitCode: null, killed: null, spawnError: `the sandbox ${this.closed ? "was destroyed" : "pod was deleted after a kill"}` }, output, started);
    }
    if (o.signal?.aborted) return stepResult({ exitCode: null, killed: "abort" }, output, started);
    let closeStream: (() => void) | null = null;
    let killing: Promise<void> = Promise.resolve();
    let onKilled: () => void = () => undefined;
    const killed = new Promise<null>((resolve) => (onKilled = () => resolve(null)));
    const watch = watchStep(o.timeoutMs, o.signal, () => {
      onKilled();
      if (this.ready) killing = this.killAll();
      setTimeout(() => closeStream?.(), WAIT_AFTER_KILL_MS).unref();
    });
    try {
      if (!this.ready) {
        try {
          // The pod is created now, with the token of this step's environment (see the module comment).
          const start = this.start(this.opts.sessionToken ?? tokenFromEnv(o.env));
          start.catch(() => undefined);
          await Promise.race([start, killed]);
        } catch (err) {
          if (err instanceof SandboxUnavailable) return stepResult({ exitCode: null, killed: null, spawnError: err.message }, output, started);
          throw err;
        }
        if (watch.why()) return stepResult({ exitCode: null, killed: watch.why() }, output, started);
      }
      const script = Buffer.from(stepScript(o.env, { workdir: this.workdir, token: this.token, workerPath: this.rt.o.workerPath }), "utf8");
      const end = await this.run(
        stepCommand(script.length, argv),
        script,
        (b) => output.out(b),
        (b) => output.err(b),
        (close) => (closeStream = close),
      );
      if (watch.why()) {
        await killing;
        return stepResult({ exitCode: null, killed: watch.why() }, output, started);
      }
      // A stream that ends without a status lost its connection (API server, kubelet): an
      // infrastructure error, thrown so the rollout is retried, not the step's outcome.
      if (!end.status) throw new Error(`the exec stream to pod ${this.podName} closed without a status`);
      const r = exitOf(end.status);
      return stepResult({ exitCode: r.exitCode, killed: null, spawnError: r.spawnError }, output, started);
    } catch (err) {
      if (watch.why()) {
        await killing;
        return stepResult({ exitCode: null, killed: watch.why() }, output, started);
      }
      throw err;
    } finally {
      watch.stop();
    }
  }

  async writeHomeFiles(files: Record<string, string>): Promise<void> {
    if (Object.keys(files).length === 0) return;
    if (!this.ready) {
      filesUnder(this.home, files); // refuses a path that escapes HOME now, not at the first exec
      Object.assign(this.pendingHome, files);
      return;
    }
    await this.upload(filesUnder(this.home, files));
  }

  async readFile(relPath: string): Promise<string | null> {
    const abs = insideWorkdir(this.workdir, relPath);
    if (!abs || !this.ready) return null;
    const read = new CappedRead();
    const end = await this.run(["sh", "-c", READ_FILE_SCRIPT, "sh", abs], null, (b) => read.push(b), () => undefined);
    if (!end.status) throw new Error(`the exec stream to pod ${this.podName} closed without a status`);
    const bytes = read.result();
    return exitOf(end.status).exitCode === 0 && bytes ? bytes.toString("utf8") : null;
  }

  /**
   * Each step is an exec into the same pod: a process an agent started in the background outlives
   * its step. `kill -9 -1` ends every process but PID 1 (as after a timeout); a pod where that
   * fails is deleted, so the evaluator fails instead of reading what a daemon wrote.
   */
  async stopLeftovers(): Promise<void> {
    if (!this.ready || this.closed || this.dead) return;
    await this.killAll();
  }

  async removeFile(relPath: string): Promise<void> {
    const abs = insideWorkdir(this.workdir, relPath);
    // No pod yet: nothing of the agent's to remove.
    if (!abs || !this.ready) return;
    const err: Buffer[] = [];
    const end = await this.run(["rm", "-rf", "--", abs], null, () => undefined, (b) => err.push(b));
    if (!end.status) throw new Error(`the exec stream to pod ${this.podName} closed without a status`);
    if (exitOf(end.status).exitCode !== 0) throw new Error(`cannot remove ${relPath} in pod ${this.podName}: ${Buffer.concat(err).toString("utf8").trim().slice(-300)}`);
  }

  async destroy(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.starting?.catch(() => undefined);
      if (this.starting && !this.spec.keep) {
        await this.rt.deletePod(this.podName);
        await this.rt.deleteSecret(this.secretName);
      }
    } finally {
      this.release();
    }
  }

  /** Pods reach the gateway directly (a NetworkPolicy seals them): the session records every lost call. */
  lostCalls(): LostCalls {
    return NO_LOST_CALLS;
  }

  describe(): string {
    return `pod ${this.rt.o.namespace}/${this.podName}`;
  }
}
