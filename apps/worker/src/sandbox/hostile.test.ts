/**
 * A hostile agent in a sealed bubblewrap sandbox that goes after the worker rather than out of the
 * sandbox: the relay it talks to is the worker's own process, so whatever it makes the relay hold
 * (connections, and the descriptors behind them) the worker holds for every rollout it runs.
 */
import { chmodSync, existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { EvaluatorSpec, RuntimeSpec } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { evaluate } from "../evaluators.js";
import { defaultSandboxPath } from "./environment.js";
import { RELAY_DIR, RELAY_SOCKET, SANDBOX_GATEWAY_PORT, probeBwrap } from "./isolation.js";
import { LocalRuntime } from "./local-runtime.js";
import { MAX_RELAY_CALLS_IN_FLIGHT, MAX_RELAY_CONNECTIONS } from "./relay.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SANDBOX_PATH = defaultSandboxPath(path.resolve(here, "../../../.."));
const support = probeBwrap();

let root: string;
let gateway: http.Server;
let gatewayPort = 0;
const held: http.ServerResponse[] = [];
let heldPeak = 0;

beforeAll(async () => {
  root = mkdtempSync(path.join(os.tmpdir(), "rg-hostile-"));
  // A root worker's sandboxes run as an unprivileged user, who must pass through it (as through /tmp).
  chmodSync(root, 0o711);
  gateway = http.createServer((req, res) => {
    if (req.url?.endsWith("/hold")) {
      // Held until the test lets go, like a long generation: counts the calls in flight at once.
      held.push(res);
      heldPeak = Math.max(heldPeak, held.length);
      req.resume();
      return;
    }
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reached: req.url }));
  });
  await new Promise<void>((r) => gateway.listen(0, "127.0.0.1", r));
  gatewayPort = (gateway.address() as { port: number }).port;
});

afterAll(async () => {
  gateway.closeAllConnections();
  await new Promise((r) => gateway.close(r));
  rmSync(root, { recursive: true, force: true });
});

const openFds = () => readdirSync("/proc/self/fd").length;

/**
 * Opens `count` connections to the relay's socket and keeps every one the relay does not close,
 * prints how many it holds, and waits for a `release` file before it lets go and makes one
 * ordinary call to its session.
 */
const FLOOD = `
import net from "node:net";
import { existsSync } from "node:fs";
const [count] = process.argv.slice(2).map(Number);
const held = new Set();
let settled = 0;
await new Promise((resolve) => {
  for (let i = 0; i < count; i++) {
    const s = net.connect("${RELAY_DIR}/${RELAY_SOCKET}");
    s.on("connect", () => { held.add(s); if (++settled === count) resolve(); });
    s.on("error", () => { if (++settled === count) resolve(); });
    s.on("close", () => held.delete(s));
  }
});
await new Promise((r) => setTimeout(r, 500));
console.log("holding " + held.size);
while (!existsSync("release")) await new Promise((r) => setTimeout(r, 100));
for (const s of held) s.destroy();
const res = await fetch(process.env.OPENAI_BASE_URL + "/models");
console.log("after " + res.status);
`;

/** Makes argv[1] calls to its session at once, each with a 1 MiB body, and prints how they were answered. */
const CALLS = `
const n = Number(process.argv[2]);
const body = "x".repeat(1 << 20);
const answers = await Promise.all(Array.from({ length: n }, () =>
  fetch(process.env.OPENAI_BASE_URL + "/hold", { method: "POST", body }).then((r) => r.status, (e) => "error " + e.cause?.code)));
const count = {};
for (const a of answers) count[a] = (count[a] ?? 0) + 1;
console.log("answers " + JSON.stringify(count));
`;

describe.skipIf(!support.usable || !support.netns)("a hostile agent against the worker's relay", () => {
  it("cannot make the worker hold more than a bounded number of its connections (each one a descriptor of the worker's)", async () => {
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support });
    const sid = "s-flood";
    const sb = await rt.create("t-flood", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", files: { "flood.mjs": FLOOD } }), {
      session: { id: sid, url: `http://127.0.0.1:${gatewayPort}/s/${sid}` },
    });
    try {
      const before = openFds();
      let out = "";
      let during = 0;
      const run = sb.exec(["node", "flood.mjs", String(MAX_RELAY_CONNECTIONS * 8)], {
        env: { PATH: SANDBOX_PATH, HOME: sb.home, OPENAI_BASE_URL: `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}/s/${sid}/v1` },
        timeoutMs: 60_000,
        onOutput: (b) => {
          out += b.toString();
          // While the agent holds everything it could keep, the worker's descriptors are counted.
          if (/holding \d+/.test(out) && during === 0) {
            during = openFds();
            writeFileSync(path.join(sb.describe(), "work", "release"), "");
          }
        },
      });
      const r = await run;
      expect(r.exitCode, r.logTail).toBe(0);
      const holding = Number(/holding (\d+)/.exec(out)![1]);
      expect(holding).toBeLessThanOrEqual(MAX_RELAY_CONNECTIONS);
      expect(during - before).toBeLessThanOrEqual(MAX_RELAY_CONNECTIONS + 16);
      // Its own session still answers once it lets go.
      expect(out).toContain("after 200");
    } finally {
      await sb.destroy();
    }
  }, 90_000);

  it("cannot have more calls in flight at the gateway than MAX_RELAY_CALLS_IN_FLIGHT (each a body the gateway holds); the rest wait their turn", async () => {
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support });
    const sid = "s-calls";
    const sb = await rt.create("t-calls", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", files: { "calls.mjs": CALLS } }), {
      session: { id: sid, url: `http://127.0.0.1:${gatewayPort}/s/${sid}` },
    });
    const calls = MAX_RELAY_CALLS_IN_FLIGHT * 3;
    try {
      heldPeak = 0;
      const run = sb.exec(["node", "calls.mjs", String(calls)], {
        env: { PATH: SANDBOX_PATH, HOME: sb.home, OPENAI_BASE_URL: `http://127.0.0.1:${SANDBOX_GATEWAY_PORT}/s/${sid}/v1` },
        timeoutMs: 60_000,
      });
      // The gateway answers what it holds, a few at a time, until every call has had its turn.
      let answered = 0;
      while (answered < calls) {
        await new Promise((r) => setTimeout(r, 50));
        for (const res of held.splice(0, 4)) {
          res.writeHead(200).end("{}");
          answered++;
        }
      }
      const r = await run;
      expect(r.stdoutTail, r.logTail).toContain(`answers {"200":${calls}}`);
      expect(heldPeak).toBeGreaterThan(1);
      expect(heldPeak).toBeLessThanOrEqual(MAX_RELAY_CALLS_IN_FLIGHT);
    } finally {
      for (const res of held.splice(0)) res.destroy();
      await sb.destroy();
    }
  }, 90_000);
});

/**
 * Leaves behind what a recursive removal trips on: a tree nested deeper than PATH_MAX (each folder
 * entered before the next is made, so no path the agent uses is long), and folders it may no
 * longer read or write into (chmod 000, 500), in its working directory and in its HOME.
 */
const LITTER = `
import os
for top in (os.getcwd(), os.environ["HOME"]):
    os.chdir(top)
    for i in range(300):
        os.mkdir("d" * 40)
        os.chdir("d" * 40)
    open("payload", "w").write("x" * 4096)
    os.chdir(top)
    for name, mode in (("locked", 0o000), ("readonly", 0o500)):
        os.makedirs(name + "/inner")
        open(name + "/inner/file", "w").write("x")
        os.chmod(name + "/inner", mode)
        os.chmod(name, mode)
print("littered")
`;

describe.skipIf(!support.usable)("a hostile agent against the worker's disk", () => {
  it("cannot leave its sandbox on the worker's disk: a tree deeper than PATH_MAX and folders it locked are removed with it", async () => {
    const warnings: string[] = [];
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support, log: { warn: (obj) => warnings.push(JSON.stringify(obj)) } });
    const sb = await rt.create("t-litter", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host", files: { "litter.py": LITTER } }));
    const r = await sb.exec(["python3", "litter.py"], { env: { PATH: SANDBOX_PATH, HOME: sb.home }, timeoutMs: 60_000 });
    expect(r.stdoutTail, r.logTail).toContain("littered");
    await sb.destroy();
    expect(warnings).toEqual([]);
    expect(rt.cleanupFailures).toBe(0);
    expect(readdirSync(root).filter((d) => d.startsWith("rollgate-t-litter-"))).toEqual([]);
  }, 90_000);
});

/**
 * Writes its answer, then fills its folders: bytes into one file of the working directory and one
 * of HOME, then empty files until no more can be made; says what each took and why it stopped.
 */
const FILLER = `
import json, os
out = {}
with open("answer.txt", "w") as f:
    f.write("0.75\\n")
chunk = b"x" * (1 << 20)
for name, folder in (("work", "."), ("home", os.environ["HOME"])):
    n = 0
    try:
        with open(os.path.join(folder, "fill"), "wb", buffering=0) as f:
            while n < (256 << 20):
                n += f.write(chunk)
    except OSError as e:
        out[name + "_error"] = e.strerror
    out[name] = n
for name in ("fill",):
    os.remove(name)
os.mkdir("many")
files = 0
try:
    while files < 100000:
        open("many/%d" % files, "w").close()
        files += 1
except OSError as e:
    out["files_error"] = e.strerror
out["files"] = files
print(json.dumps(out))
`;

const root0 = process.getuid?.() === 0;
describe.skipIf(!support.usable || !root0)(`a hostile agent against the worker's disk, with a disk quota${root0 ? "" : " (skipped: the capped tmpfs is mounted by a root worker only)"}`, () => {
  it("cannot fill the worker's disk or its inodes: its writes fail in the sandbox, the evaluator scores what it left, another rollout writes on", async () => {
    const quota = { bytes: 16 * 1024 * 1024, inodes: 500 };
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support, diskQuota: quota });
    const spec = RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host", files: { "filler.py": FILLER } });
    const sb = await rt.create("t-quota", spec);
    const other = await rt.create("t-quota-other", spec);
    const bases = [sb.describe(), other.describe()];
    try {
      const env = { PATH: SANDBOX_PATH, HOME: sb.home };
      const r = await sb.exec(["python3", "filler.py"], { env, timeoutMs: 60_000 });
      expect(r.exitCode, r.logTail).toBe(0);
      const took = JSON.parse(r.stdoutTail.trim().split("\n").at(-1)!) as Record<string, number | string>;
      // The working directory and HOME share the cap; a write past it fails in the sandbox.
      expect(took.work_error, JSON.stringify(took)).toBe("No space left on device");
      expect(Number(took.work) + Number(took.home)).toBeLessThanOrEqual(quota.bytes);
      expect(took.files_error, JSON.stringify(took)).toBe("No space left on device");
      expect(took.files).toBeLessThan(quota.inodes);
      // Its files fill the cap (its big files it removed again): the rollout's outcome says so.
      expect(await sb.limitsReached!()).toEqual(["inodes"]);
      expect(await other.limitsReached!()).toEqual([]);
      // The worker reads what it left, and its evaluator runs (its fresh folders are not in the full tmpfs).
      expect(await sb.readFile("answer.txt")).toBe("0.75\n");
      const grade = EvaluatorSpec.parse({ kind: "command", command: ["bash", "-c", "cat answer.txt"], reward: "last_line_float" });
      expect(await evaluate(grade, { sandbox: sb, env, summary: () => ({}) })).toMatchObject({ kind: "scored", reward: 0.75 });
      // Another rollout's folders are its own: it fills its own cap, as much as the first did.
      const o = await other.exec(["python3", "filler.py"], { env: { PATH: SANDBOX_PATH, HOME: other.home }, timeoutMs: 60_000 });
      const tookOther = JSON.parse(o.stdoutTail.trim().split("\n").at(-1)!) as Record<string, number | string>;
      expect(Number(tookOther.work) + Number(tookOther.home)).toBeGreaterThan(quota.bytes / 2);
      expect(tookOther.files).toBe(took.files);
    } finally {
      await sb.destroy();
      await other.destroy();
    }
    expect(rt.cleanupFailures).toBe(0);
    // Unmounted and removed: nothing stays in the worker's memory or on its disk.
    const mounts = readFileSync("/proc/self/mounts", "utf8");
    for (const base of bases) {
      expect(mounts).not.toContain(base);
      expect(existsSync(base)).toBe(false);
    }
  }, 120_000);
});

/**
 * Writes up to `limit` bytes to a file in each folder it names, and says how much each took:
 * tmpfs folders hold the host's memory.
 */
const FILL = `
import json, os, sys
limit = int(sys.argv[1])
chunk = b"x" * (1 << 20)
out = {}
for folder in sys.argv[2:]:
    n = 0
    try:
        with open(os.path.join(folder, "fill"), "wb", buffering=0) as f:
            while n < limit:
                n += f.write(chunk)
    except OSError as e:
        out[folder + ":error"] = e.strerror
    out[folder] = n
    try:
        os.remove(os.path.join(folder, "fill"))
    except OSError:
        pass
with open("/dev/null", "w") as f:
    f.write("devices still work")
print(json.dumps(out))
`;

describe.skipIf(!support.usable || !support.sizedTmpfs)("a hostile agent against the worker's memory", () => {
  it("cannot fill the host's memory through the sandbox's tmpfs folders (/tmp, /dev/shm, /dev, its root)", async () => {
    const cap = 16 * 1024 * 1024;
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support, tmpfsBytes: cap });
    const sb = await rt.create("t-fill", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host", files: { "fill.py": FILL } }));
    try {
      const r = await sb.exec(["python3", "fill.py", String(3 * cap), "/tmp", "/var/tmp", "/dev/shm", "/dev", "/", "/rollgate", sb.workdir], {
        env: { PATH: SANDBOX_PATH, HOME: sb.home },
        timeoutMs: 60_000,
      });
      expect(r.exitCode, r.logTail).toBe(0);
      const took = JSON.parse(r.stdoutTail.trim().split("\n").at(-1)!) as Record<string, number>;
      for (const folder of ["/tmp", "/var/tmp", "/dev/shm"]) {
        expect(took[folder], `${folder}: ${JSON.stringify(took)}`).toBeLessThanOrEqual(cap);
        expect(took[folder], `${folder}: ${JSON.stringify(took)}`).toBeGreaterThan(0);
      }
      for (const folder of ["/dev", "/", "/rollgate"]) expect(took[folder], `${folder}: ${JSON.stringify(took)}`).toBe(0);
      // Its own folders are on the worker's disk, as they always were.
      expect(took[sb.workdir]).toBe(3 * cap);
    } finally {
      await sb.destroy();
    }
  }, 90_000);
});

/**
 * Takes memory 16 MiB at a time (touched, so it is really the host's) up to argv[1] MiB, says how
 * much it got, and tries to make itself a worse choice for the out-of-memory killer.
 */
const HOG = `
import sys
chunks = []
try:
    while len(chunks) * 16 < int(sys.argv[1]):
        chunks.append(bytearray(16 << 20))
    print("took", len(chunks) * 16, flush=True)
except MemoryError:
    print("refused at", len(chunks) * 16, flush=True)
with open("/proc/self/oom_score_adj") as f:
    print("oom_score_adj", f.read().strip())
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
    print("lowered")
except OSError as e:
    print("cannot lower:", e.strerror)
sys.exit(0 if chunks and len(chunks) * 16 >= int(sys.argv[1]) else 3)
`;

describe.skipIf(!support.usable || !support.prlimit)("a hostile agent against the worker's memory, with its processes", () => {
  it("a memory hog has its allocations refused at the per-process limit, is the OOM killer's first choice, and the sandbox goes on", async () => {
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support, processMemoryBytes: 128 * 1024 * 1024 });
    const sb = await rt.create("t-hog", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host", files: { "hog.py": HOG } }));
    try {
      const env = { PATH: SANDBOX_PATH, HOME: sb.home };
      const hog = await sb.exec(["python3", "hog.py", "1024"], { env, timeoutMs: 60_000 });
      const refusedAt = Number(/refused at (\d+)/.exec(hog.stdoutTail)?.[1]);
      expect(refusedAt, hog.logTail).toBeLessThan(128);
      expect(hog.exitCode).toBe(3);
      if (support.choom) {
        expect(hog.stdoutTail).toContain("oom_score_adj 1000");
        expect(hog.stdoutTail).toMatch(/cannot lower: Permission denied/);
      }
      // Within the limit, the next step of the same sandbox runs as before.
      const small = await sb.exec(["python3", "hog.py", "64"], { env, timeoutMs: 60_000 });
      expect(small.stdoutTail, small.logTail).toContain("took 64");
      expect(small.exitCode).toBe(0);
    } finally {
      await sb.destroy();
    }
  }, 90_000);
});

/** Forks up to argv[1] children that wait, and says how many it got. */
const FORK = `
import os, sys, time
kids = []
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
print("forked", len(kids), flush=True)
if len(sys.argv) > 2:
    # Holds its processes until the test says every sandbox holds its own (a barrier on loopback).
    import socket
    with socket.create_connection(("127.0.0.1", int(sys.argv[2]))) as s:
        s.recv(1)
`;

describe.skipIf(!support.usable || !support.prlimit)("a hostile agent against the host's process slots", () => {
  it("cannot run more processes than the sandbox may (a fork bomb stops at the limit), and a missing program is still a spawn error", async () => {
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support, maxProcs: 64 });
    const sb = await rt.create("t-fork", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host", files: { "fork.py": FORK } }));
    try {
      const r = await sb.exec(["python3", "fork.py", "300"], { env: { PATH: SANDBOX_PATH, HOME: sb.home }, timeoutMs: 60_000 });
      const forked = Number(/forked (\d+)/.exec(r.stdoutTail)?.[1]);
      expect(forked, r.logTail).toBeGreaterThan(0);
      expect(forked).toBeLessThan(64);
      const missing = await sb.exec(["no-such-agent-here"], { env: { PATH: SANDBOX_PATH }, timeoutMs: 20_000 });
      expect(missing.spawnError, missing.logTail).toMatch(/no-such-agent-here/);
    } finally {
      await sb.destroy();
    }
  }, 90_000);

  it("a root worker's sandboxes run as its unprivileged user, and two of them (the same user) each have their own limit", async () => {
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support, maxProcs: 64 });
    const a = await rt.create("t-fork-a", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host", files: { "fork.py": FORK } }));
    const b = await rt.create("t-fork-b", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host", files: { "fork.py": FORK } }));
    try {
      const env = { PATH: SANDBOX_PATH, HOME: a.home };
      // Each holds its 40 processes until both have forked theirs: they are counted at the same time.
      const waiting: net.Socket[] = [];
      const barrier = net.createServer((c) => {
        waiting.push(c);
        if (waiting.length === 2) for (const w of waiting) w.end("g");
      });
      await new Promise<void>((r) => barrier.listen(0, "127.0.0.1", r));
      const port = String((barrier.address() as net.AddressInfo).port);
      const [ra, rb] = await Promise.all([a.exec(["python3", "fork.py", "40", port], { env, timeoutMs: 60_000 }), b.exec(["python3", "fork.py", "40", port], { env, timeoutMs: 60_000 })]);
      barrier.close();
      expect(waiting).toHaveLength(2);
      expect(ra.stdoutTail, ra.logTail).toContain("forked 40");
      expect(rb.stdoutTail, rb.logTail).toContain("forked 40");
      // Its files are its own (it may change what the task gave it), and never root's.
      const who = await a.exec(["bash", "-c", "id -u; echo changed >> fork.py && echo ok"], { env, timeoutMs: 20_000 });
      const uid = Number(who.stdoutTail.trim().split("\n")[0]);
      expect(who.stdoutTail, who.logTail).toContain("ok");
      if (process.getuid?.() === 0) expect(uid).toBe(support.user?.uid);
      else expect(uid).toBe(process.getuid?.());
      expect(await a.readFile("fork.py")).toContain("changed");
    } finally {
      await a.destroy();
      await b.destroy();
    }
    expect(rt.cleanupFailures).toBe(0);
  }, 120_000);
});

/** Makes each system call named in argv (x86_64 numbers) with zero arguments, and prints how the kernel answered. */
const SYSCALLS = `
import ctypes, errno, json, sys
NR = {"io_uring_setup": 425, "io_uring_enter": 426, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "getpid": 39, "getcwd": 79}
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name in sys.argv[1:]:
    ctypes.set_errno(0)
    r = libc.syscall(NR[name], 0, 0, 0, 0, 0)
    out[name] = "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
print(json.dumps(out))
`;

describe.skipIf(!support.usable || !support.seccomp || process.arch !== "x64")(`a hostile agent against the kernel${support.seccomp ? "" : " (skipped: this bubblewrap cannot load a seccomp filter)"}`, () => {
  it("finds io_uring, bpf, perf_event_open, userfaultfd and the key calls missing (ENOSYS), while ordinary calls and programs work", async () => {
    const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support });
    const sb = await rt.create("t-seccomp", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host", files: { "calls.py": SYSCALLS } }));
    try {
      const denied = ["io_uring_setup", "io_uring_enter", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key"];
      const r = await sb.exec(["python3", "calls.py", ...denied, "getpid", "getcwd"], { env: { PATH: SANDBOX_PATH, HOME: sb.home }, timeoutMs: 30_000 });
      expect(r.exitCode, r.logTail).toBe(0);
      const answers = JSON.parse(r.stdoutTail.trim().split("\n").at(-1)!) as Record<string, string>;
      for (const name of denied) expect(answers[name], JSON.stringify(answers)).toBe("ENOSYS");
      expect(answers.getpid).toBe("ok");
      // node (libuv probes io_uring) still runs.
      const node = await sb.exec(["node", "-e", "require('fs').writeFileSync('n.txt', 'node ran')"], { env: { PATH: SANDBOX_PATH, HOME: sb.home }, timeoutMs: 30_000 });
      expect(node.exitCode, node.logTail).toBe(0);
      expect(await sb.readFile("n.txt")).toBe("node ran");
    } finally {
      await sb.destroy();
    }
  }, 60_000);
});

describe.skipIf(!support.usable)("a hostile agent against its grader's hidden files", () => {
  it("cannot read what only its evaluator may (ROLLGATE_EVALUATOR_BINDS: hidden tests, expected answers), which the evaluator reads", async () => {
    const hidden = mkdtempSync(path.join(os.tmpdir(), "rg-hidden-tests-"));
    // Readable by the user a root worker's sandboxes (and so their evaluators) run as.
    chmodSync(hidden, 0o755);
    try {
      writeFileSync(path.join(hidden, "expected.txt"), "the hidden answer\n");
      const rt = new LocalRuntime({ root, sandboxPath: SANDBOX_PATH, bwrap: support, evaluatorBinds: [hidden] });
      const grade = EvaluatorSpec.parse({ kind: "command", command: ["bash", "-c", `cmp -s ${hidden}/expected.txt answer.txt && echo 1 || echo 0`], reward: "last_line_float" });
      const score = async (agent: string) => {
        const sb = await rt.create("t-hidden", RuntimeSpec.parse({ kind: "local", isolation: "bwrap", network: "host" }));
        try {
          const env = { PATH: SANDBOX_PATH, HOME: sb.home };
          const r = await sb.exec(["bash", "-c", agent], { env, timeoutMs: 20_000 });
          const outcome = await evaluate(grade, { sandbox: sb, env, summary: () => ({}) });
          return { agent: r, outcome };
        } finally {
          await sb.destroy();
        }
      };
      // The cheat: copy the expected answer from where the grader keeps it.
      const cheat = await score(`cat ${hidden}/expected.txt > answer.txt`);
      expect(cheat.agent.logTail).toMatch(/No such file or directory/);
      expect(cheat.outcome).toMatchObject({ kind: "scored", reward: 0 });
      // The evaluator does see it: an agent that knows the answer scores.
      const honest = await score("echo 'the hidden answer' > answer.txt");
      expect(honest.outcome).toMatchObject({ kind: "scored", reward: 1 });
    } finally {
      rmSync(hidden, { recursive: true, force: true });
    }
  }, 60_000);
});
