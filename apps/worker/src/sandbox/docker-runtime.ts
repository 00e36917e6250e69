import { randomBytes } from "node:crypto";
import path from "node:path";
import { Writable, type Readable } from "node:stream";
import { type LostCalls, type RuntimeSpec, runtimeNetwork } from "@rollgate/protocol";
import Docker from "dockerode";
import { sandboxEgressPolicy } from "../egress.js";
import {
  CONTAINER_HOME,
  CONTAINER_TMP,
  CappedRead,
  type ContainerRuntimeOptions,
  DEFAULT_WORKDIR,
  IDLE_COMMAND,
  StepOutput,
  cpuToNumber,
  dnsName,
  insideWorkdir,
  memoryToBytes,
  stepResult,
  watchStep,
} from "./container-common.js";
import { SandboxUnavailable } from "./local-runtime.js";
import type { RunResult } from "./process.js";
import { SessionRelay, egressProxyEnv } from "./relay.js";
import { NO_LOST_CALLS, type CreateOptions, type ExecOptions, type Sandbox, type SandboxRuntime } from "./runtime.js";
import { type TarEntry, buildTar, readTar } from "./tar.js";
import { MAX_READ_BYTES } from "./workdir.js";

/** What a one-file archive adds to the file: its headers (long names take a few blocks) and padding. */
const TAR_OVERHEAD = 64 * 1024;

/**
 * `runtime.kind: "docker"`: one container per rollout on the worker's Docker engine, through
 * dockerode and the Docker Engine API.
 *
 * - The container runs the task's image with `sleep infinity` as its only process, in
 *   `runtime.workdir` (default /workspace), labelled `rollgate.sandbox=1`, `rollgate.task=<id>`,
 *   `rollgate.worker=<worker name>`, with the task's CPU/memory limits (NanoCpus, Memory, no extra
 *   swap). Its config holds no secret: Env is empty.
 * - Network, `runtime.network: "sealed"` (the default): the container is the only one on a
 *   network of its own, created for it with `Internal: true` (no route out, no port published,
 *   never the host's network), and the worker's relay for the session (relay.ts) is the only
 *   other thing on it: it listens on the network's gateway address (the host side of its
 *   bridge: the worker runs on the Docker host) or, with ROLLGATE_DOCKER_RELAY_CONTAINER, on the
 *   address of the worker's own container, which is connected to the network for the rollout.
 *   The agent's session URL points at the relay; `runtime.egress` goes through it as an HTTP
 *   proxy. Other sandboxes, their relays, Redis and the engines are on other networks.
 *   `host`: the worker's ROLLGATE_DOCKER_NETWORK, as it is.
 * - `runtime.files` (and HOME, TMPDIR) are copied in with one PUT /containers/:id/archive of a tar
 *   built here, before the container starts. Directories are 0777 and files 0666 so an image with a
 *   non-root user can use them.
 * - Each step is a `docker exec` (POST /containers/:id/exec + the hijacked, multiplexed
 *   /exec/:id/start stream) with exactly the documented environment (docs/agent-environment.md#environment-variables) in the exec's Env — the session
 *   token lives only there, never in the container config — on top of the image's own ENV. A PATH
 *   equal to the worker's local sandbox PATH is dropped so the image's PATH applies.
 * - Timeouts and cancels: the Engine API cannot kill an exec, so the worker kills the whole
 *   container (SIGKILL to PID 1 takes every process of its PID namespace with it: the step and
 *   everything it started). The container is started again, files intact, if another step follows
 *   (evaluators, readFile work on a stopped container too).
 * - `destroy` removes the container with force (and its anonymous volumes) whatever happened,
 *   then closes the relay and removes the sandbox's network; `runtime.keep` stops the container
 *   instead and labels it `rollgate.keep=true` so sweeps leave it.
 * - `sweep()` (worker start) force-removes every container, then every network, labelled with
 *   this worker's name that a crashed predecessor of the same ROLLGATE_WORKER_NAME left behind.
 */

export interface DockerRuntimeOptions extends ContainerRuntimeOptions {
  docker: Docker;
  /** The network of `runtime.network: "host"` containers (ROLLGATE_DOCKER_NETWORK). */
  defaultNetwork: string;
  /**
   * The worker's own container (ROLLGATE_DOCKER_RELAY_CONTAINER), when the worker runs in one on
   * this engine: it joins each sealed sandbox's network and the relay listens on its address
   * there. Unset: the relay listens on the sandbox network's gateway (host) address.
   */
  relayContainer?: string;
  /** Destinations no sealed sandbox reaches whatever its `runtime.egress` (the worker's infrastructure). */
  egressDeny?: string[];
  /** Pull an image the engine does not have (default true). */
  pull?: boolean;
  log?: { warn: (obj: object, msg: string) => void };
}

/** A dockerode client for a DOCKER_HOST-style address (unix:///path, /path, tcp://host:port, http(s)://host:port). */
export function dockerFromHost(host: string): Docker {
  if (host.startsWith("unix://")) return new Docker({ socketPath: host.slice("unix://".length) });
  if (host.startsWith("/")) return new Docker({ socketPath: host });
  const u = new URL(host.replace(/^tcp:/, "http:"));
  const protocol = u.protocol === "https:" ? "https" : "http";
  return new Docker({ host: u.hostname, port: Number(u.port || (protocol === "https" ? 2376 : 2375)), protocol });
}

function statusOf(err: unknown): number | undefined {
  const s = (err as { statusCode?: unknown }).statusCode;
  return typeof s === "number" ? s : undefined;
}

const WAIT_AFTER_KILL_MS = 5_000;

export class DockerRuntime implements SandboxRuntime {
  private readonly pulls = new Map<string, Promise<void>>();
  constructor(private readonly o: DockerRuntimeOptions) {}

  /** Makes sure the engine has the image: inspect, and pull it (once for concurrent rollouts) when missing. */
  private async ensureImage(image: string): Promise<void> {
    try {
      await this.o.docker.getImage(image).inspect();
      return;
    } catch (err) {
      if (statusOf(err) !== 404) throw err;
    }
    if (this.o.pull === false) throw new SandboxUnavailable(`image ${image} is not on this Docker engine (pulling is off)`);
    let p = this.pulls.get(image);
    if (!p) {
      p = new Promise<void>((resolve, reject) => {
        // The callback form reports every outcome; the promise dockerode also returns would only repeat it.
        void this.o.docker.pull(image, (err: Error | null, stream?: Readable) => {
          if (err || !stream) return reject(err ?? new Error("no pull stream"));
          this.o.docker.modem.followProgress(stream, (e: Error | null) => (e ? reject(e) : resolve()));
        });
      }).finally(() => this.pulls.delete(image));
      this.pulls.set(image, p);
    }
    try {
      await p;
    } catch (err) {
      const msg = (err as Error).message;
      // A 404 is typed; a failure reported mid-pull arrives only as the text of Docker's progress stream.
      if (statusOf(err) === 404 || /not found|denied|manifest unknown|invalid reference/i.test(msg)) {
        throw new SandboxUnavailable(`cannot pull image ${image}: ${msg}`);
      }
      throw err;
    }
  }

  /** Labels of everything this runtime creates for a task. */
  private labels(taskId: string, keep: boolean): Record<string, string> {
    return {
      "rollgate.sandbox": "1",
      "rollgate.task": taskId,
      "rollgate.worker": this.o.workerName,
      ...(keep ? { "rollgate.keep": "true" } : {}),
    };
  }

  /**
   * A sealed sandbox's network (internal: no route out) and its relay on it. The relay's address
   * is the network's gateway, or the worker container's address once connected to it.
   */
  private async sealedNetwork(name: string, taskId: string, spec: RuntimeSpec, session: NonNullable<CreateOptions["session"]>): Promise<SealedNet> {
    const network = await this.o.docker.createNetwork({
      Name: name,
      Driver: "bridge",
      Internal: true,
      Attachable: false,
      EnableIPv6: false,
      Labels: this.labels(taskId, false),
      Options: { "com.docker.network.bridge.enable_ip_masquerade": "false" },
    });
    const net: SealedNet = { network, relay: null, relayContainer: null };
    try {
      let address: string | undefined;
      if (this.o.relayContainer) {
        await network.connect({ Container: this.o.relayContainer });
        net.relayContainer = this.o.relayContainer;
        const info = (await network.inspect()) as { Containers?: Record<string, { Name?: string; IPv4Address?: string }> };
        const self = Object.entries(info.Containers ?? {}).find(([id, c]) => id.startsWith(this.o.relayContainer!) || c.Name === this.o.relayContainer);
        address = self?.[1].IPv4Address?.split("/")[0];
      } else {
        const info = (await network.inspect()) as { IPAM?: { Config?: { Gateway?: string }[] } };
        address = info.IPAM?.Config?.find((c) => c.Gateway)?.Gateway;
      }
      if (!address) throw new Error(`docker network ${name}: no address for the sandbox relay`);
      net.relay = await SessionRelay.listen(
        {
          sessionId: session.id,
          sessionUrl: session.url,
          egress: sandboxEgressPolicy(spec.egress, [...(this.o.egressDeny ?? []), new URL(session.url).hostname]),
          ...(this.o.log ? { log: this.o.log } : {}),
        },
        { host: address, port: 0 },
      ).catch((err: NodeJS.ErrnoException) => {
        // Not an address of this machine: the worker is not where the relay must be. Retrying will not help.
        if (err.code === "EADDRNOTAVAIL") {
          throw new SandboxUnavailable(
            `the sandbox relay cannot listen on ${address} (network ${name}): a worker outside a container must run on the Docker host; one in a container needs ROLLGATE_DOCKER_RELAY_CONTAINER`,
          );
        }
        throw err;
      });
      net.url = `http://${address}:${net.relay.port}`;
      return net;
    } catch (err) {
      await removeSealedNet(net, this.o.log);
      throw err;
    }
  }

  async create(taskId: string, spec: RuntimeSpec, opts: CreateOptions = {}): Promise<Sandbox> {
    if (!spec.image) throw new SandboxUnavailable("runtime.kind docker needs runtime.image");
    const sealed = runtimeNetwork(spec) === "sealed";
    if (sealed && !opts.session) throw new Error("a sealed sandbox needs its session (CreateOptions.session)");
    await this.ensureImage(spec.image);
    const workdir = spec.workdir ?? DEFAULT_WORKDIR;
    const name = `rollgate-${dnsName(taskId, 40)}-${randomBytes(3).toString("hex")}`;
    const net = sealed ? await this.sealedNetwork(name, taskId, spec, opts.session!) : null;
    const memory = spec.resources?.memory !== undefined ? memoryToBytes(spec.resources.memory) : undefined;
    const cpu = spec.resources?.cpu !== undefined ? cpuToNumber(spec.resources.cpu) : undefined;
    let container: Docker.Container;
    try {
      container = await this.o.docker.createContainer({
        name,
        Image: spec.image,
        Cmd: IDLE_COMMAND,
        WorkingDir: workdir,
        Env: [],
        Tty: false,
        OpenStdin: false,
        Labels: this.labels(taskId, spec.keep),
        HostConfig: {
          NetworkMode: net ? name : this.o.defaultNetwork,
          ...(cpu !== undefined ? { NanoCpus: Math.round(cpu * 1e9) } : {}),
          ...(memory !== undefined ? { Memory: memory, MemorySwap: memory } : {}),
          AutoRemove: false,
        },
      });
    } catch (err) {
      if (net) await removeSealedNet(net, this.o.log);
      // A network or image the engine does not know will not appear on a retry.
      if (statusOf(err) === 404) throw new SandboxUnavailable(`cannot create the container: ${(err as Error).message}`);
      throw err;
    }
    const sessionUrl = net?.url && opts.session ? `${net.url}/s/${encodeURIComponent(opts.session.id)}` : null;
    const proxyEnv = net?.url && spec.egress.length > 0 ? egressProxyEnv(net.url) : {};
    const sandbox = new DockerSandbox(container, name, workdir, spec.keep, this.o, net, sessionUrl, proxyEnv);
    try {
      await container.putArchive(buildTar(layoutEntries(workdir, spec.files)), { path: "/" });
      await container.start();
    } catch (err) {
      await sandbox.destroy();
      throw err;
    }
    return sandbox;
  }

  /** Removes every container, then every sandbox network, this worker (by name) left behind, except kept containers. */
  async sweep(): Promise<number> {
    const mine = JSON.stringify({ label: [`rollgate.worker=${this.o.workerName}`] });
    const list = await this.o.docker.listContainers({ all: true, filters: mine });
    let removed = 0;
    for (const c of list) {
      if (c.Labels?.["rollgate.keep"] === "true") continue;
      try {
        await this.o.docker.getContainer(c.Id).remove({ force: true, v: true });
        removed++;
      } catch (err) {
        if (statusOf(err) !== 404) this.o.log?.warn({ container: c.Id, err: (err as Error).message }, "sweep: cannot remove a leftover sandbox container");
      }
    }
    for (const n of await this.o.docker.listNetworks({ filters: mine })) {
      try {
        const network = this.o.docker.getNetwork(n.Id);
        if (this.o.relayContainer) await network.disconnect({ Container: this.o.relayContainer, Force: true }).catch(() => undefined);
        await network.remove();
      } catch (err) {
        // A network a kept container still uses stays (409).
        if (statusOf(err) !== 404 && statusOf(err) !== 409) this.o.log?.warn({ network: n.Name, err: (err as Error).message }, "sweep: cannot remove a leftover sandbox network");
      }
    }
    return removed;
  }
}

/** The folders every container sandbox has, and the task's files in the working directory (paths relative to /). */
export function layoutEntries(workdir: string, files: Record<string, string>): TarEntry[] {
  const rel = (p: string) => p.replace(/^\/+/, "");
  const entries: TarEntry[] = [
    { path: rel(workdir), type: "dir" },
    { path: rel(path.posix.dirname(CONTAINER_HOME)), type: "dir", mode: 0o755 },
    { path: rel(CONTAINER_HOME), type: "dir" },
    { path: rel(CONTAINER_TMP), type: "dir" },
  ];
  return [...entries, ...filesUnder(workdir, files)];
}

/** Tar entries for files under `dir` (with their parent folders); a path that escapes `dir` is refused. */
export function filesUnder(dir: string, files: Record<string, string>): TarEntry[] {
  const out: TarEntry[] = [];
  const dirs = new Set<string>();
  for (const [relPath, content] of Object.entries(files)) {
    const target = insideWorkdir(dir, relPath);
    if (!target) throw new Error(`file path escapes the sandbox folder: ${relPath}`);
    for (let d = path.posix.dirname(target); d.length > dir.length; d = path.posix.dirname(d)) {
      if (!dirs.has(d)) {
        dirs.add(d);
        out.push({ path: d.slice(1), type: "dir" });
      }
    }
    out.push({ path: target.slice(1), type: "file", content });
  }
  // Parents before children.
  return out.sort((a, b) => (a.type === b.type ? 0 : a.type === "dir" ? -1 : 1));
}

interface SealedNet {
  network: Docker.Network;
  relay: SessionRelay | null;
  /** The worker container connected to the network, to disconnect. */
  relayContainer: string | null;
  /** The relay's base URL as the container reaches it. */
  url?: string;
}

/** Closes a sealed sandbox's relay and removes its network (after its container is gone); failures are logged. */
async function removeSealedNet(net: SealedNet, log: DockerRuntimeOptions["log"]): Promise<void> {
  const warn = (what: string, err: unknown) => log?.warn({ network: net.network.id, err: (err as Error).message }, `cannot ${what} (the start-up sweep will)`);
  if (net.relay) await net.relay.close().catch((e: unknown) => warn("close a sandbox relay", e));
  if (net.relayContainer) {
    await net.network.disconnect({ Container: net.relayContainer, Force: true }).catch((e: unknown) => {
      if (statusOf(e) !== 404) warn("disconnect the worker from a sandbox network", e);
    });
  }
  await net.network.remove().catch((e: unknown) => {
    if (statusOf(e) !== 404) warn("remove a sandbox network", e);
  });
}

class DockerSandbox implements Sandbox {
  readonly home = CONTAINER_HOME;
  readonly tmp = CONTAINER_TMP;
  private destroyed = false;
  /** Set while the container is stopped after a timeout/cancel kill; the next exec starts it again. */
  private stopped: Promise<void> | null = null;

  constructor(
    private readonly container: Docker.Container,
    private readonly name: string,
    readonly workdir: string,
    private readonly keep: boolean,
    private readonly o: DockerRuntimeOptions,
    private readonly net: SealedNet | null,
    readonly sessionUrl: string | null,
    private readonly proxyEnv: Record<string, string>,
  ) {}

  private kill(): Promise<void> {
    const p = this.container.kill({ signal: "SIGKILL" }).then(
      () => undefined,
      () => undefined, // already stopped or gone
    );
    this.stopped = p;
    return p;
  }

  private async ensureRunning() {
    if (!this.stopped) return;
    await this.stopped;
    this.stopped = null;
    await this.container.start();
  }

  private envList(env: Record<string, string>): string[] {
    return Object.entries({ ...env, ...this.proxyEnv })
      .filter(([k, v]) => !(k === "PATH" && this.o.workerPath !== undefined && v === this.o.workerPath))
      .map(([k, v]) => `${k}=${v}`);
  }

  async exec(argv: string[], o: ExecOptions): Promise<RunResult> {
    const started = Date.now();
    const output = new StepOutput(o.onOutput);
    if (this.destroyed) return stepResult({ exitCode: null, killed: null, spawnError: "the sandbox was destroyed" }, output, started);
    if (o.signal?.aborted) return stepResult({ exitCode: null, killed: "abort" }, output, started);
    let stream: NodeJS.ReadWriteStream | null = null;
    let killing: Promise<void> = Promise.resolve();
    const watch = watchStep(o.timeoutMs, o.signal, () => {
      killing = this.kill();
      // Should the engine not end the stream when the container dies, stop waiting for it.
      const s = stream;
      setTimeout(() => (s as unknown as { destroy?: () => void } | null)?.destroy?.(), WAIT_AFTER_KILL_MS).unref();
    });
    try {
      await this.ensureRunning();
      const ex = await this.container.exec({
        Cmd: argv,
        Env: this.envList(o.env),
        WorkingDir: this.workdir,
        AttachStdin: false,
        AttachStdout: true,
        AttachStderr: true,
        Tty: false,
      });
      if (!watch.why()) {
        stream = (await ex.start({ hijack: true, stdin: false })) as NodeJS.ReadWriteStream;
        await this.pump(stream, output);
      }
      if (watch.why()) {
        await killing;
        return stepResult({ exitCode: null, killed: watch.why() }, output, started);
      }
      const info = await ex.inspect();
      return stepResult({ exitCode: typeof info.ExitCode === "number" ? info.ExitCode : null, killed: null }, output, started);
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

  /** Demultiplexes the exec stream (8-byte frame headers: stream type, size) into the step's output. */
  private pump(stream: NodeJS.ReadWriteStream, output: StepOutput): Promise<void> {
    return new Promise((resolve) => {
      const sink = (f: (b: Buffer) => void) =>
        new Writable({
          write(chunk: Buffer, _enc, cb) {
            f(chunk);
            cb();
          },
        });
      this.o.docker.modem.demuxStream(stream, sink((b) => output.out(b)), sink((b) => output.err(b)));
      let done = false;
      const finish = () => {
        if (done) return;
        done = true;
        resolve();
      };
      stream.on("end", finish);
      stream.on("close", finish);
      // An error on the stream (the container was killed under it) ends the step like an end.
      stream.on("error", finish);
    });
  }

  async writeHomeFiles(files: Record<string, string>): Promise<void> {
    if (Object.keys(files).length === 0) return;
    await this.container.putArchive(buildTar(filesUnder(this.home, files)), { path: "/" });
  }

  async readFile(relPath: string): Promise<string | null> {
    const abs = insideWorkdir(this.workdir, relPath);
    if (!abs) return null;
    let stream: NodeJS.ReadableStream;
    try {
      stream = await this.container.getArchive({ path: abs });
    } catch (err) {
      if (statusOf(err) === 404) return null;
      throw err;
    }
    // The archive of one file: the file and a few headers. Read no further than a file the limit
    // allows would need (a sparse file the agent made huge costs it nothing, and the worker its memory).
    const read = new CappedRead(MAX_READ_BYTES + TAR_OVERHEAD);
    for await (const c of stream as AsyncIterable<Buffer>) {
      read.push(c);
      if (read.over) break; // ends the archive stream
    }
    const tar = read.result();
    if (!tar) return null;
    const want = path.posix.basename(abs);
    // Only a regular file reads (a FIFO, a device or a link archives as what it is, without content).
    const entry = readTar(tar).find((e) => e.type === "file" && e.path === want);
    const content = entry ? Buffer.from(entry.content ?? "") : null;
    return content && content.length <= MAX_READ_BYTES ? content.toString("utf8") : null;
  }

  /**
   * Each step is an exec into the same long-lived container: a process an agent started in the
   * background outlives its step. Killing the container (SIGKILL to PID 1 takes every process of
   * its PID namespace) ends them all; the next step starts it again, files intact.
   */
  async stopLeftovers(): Promise<void> {
    if (this.destroyed || this.stopped) return;
    await this.kill();
  }

  async removeFile(relPath: string): Promise<void> {
    const abs = insideWorkdir(this.workdir, relPath);
    if (!abs) return;
    // The Engine API has no delete for a container's file: rm in the container (a step of its own).
    const r = await this.exec(["rm", "-rf", "--", abs], { env: {}, timeoutMs: 60_000 });
    if (r.exitCode !== 0) throw new Error(`cannot remove ${relPath} in the container: ${r.spawnError ?? (r.logTail.trim().slice(-300) || `exit ${r.exitCode}`)}`);
  }

  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    try {
      if (this.keep) await this.container.kill({ signal: "SIGKILL" });
      else await this.container.remove({ force: true, v: true });
    } catch (err) {
      const s = statusOf(err);
      if (s !== 404 && s !== 409) this.o.log?.warn({ container: this.name, err: (err as Error).message }, "cannot remove a sandbox container (the start-up sweep will)");
    }
    // A kept container keeps its network (the sweep leaves it too); its relay closes with the rollout.
    if (this.net && this.keep) {
      await this.net.relay?.close().catch((e: unknown) => this.o.log?.warn({ container: this.name, err: (e as Error).message }, "cannot close a sandbox relay"));
    }
    else if (this.net) await removeSealedNet(this.net, this.o.log);
  }

  lostCalls(): LostCalls {
    return this.net?.relay?.lost ?? NO_LOST_CALLS;
  }

  describe(): string {
    return `docker container ${this.name} (${this.container.id.slice(0, 12)})`;
  }
}
