/**
 * The pieces both container runtimes share: the tar they copy files with (checked against the
 * system's tar(1)), quantities, label-safe names, the pod-bound semaphore, and the RuntimeSpec /
 * WorkerEnv fields that configure them.
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseEnv } from "@rollgate/config";
import { RuntimeSpec, Task, runtimeNetwork } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { Semaphore, cpuToNumber, dnsName, labelValue, memoryToBytes } from "./container-common.js";
import { buildTar, readTar } from "./tar.js";
import { WorkerEnv } from "../env.js";

describe("tar", () => {
  it("writes archives tar(1) extracts, long names included, and reads what tar(1) writes", () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), "rg-tar-"));
    try {
      const long = `deep/${"d".repeat(90)}/${"f".repeat(60)}.txt`;
      const tar = buildTar([
        { path: "workspace", type: "dir" },
        { path: "workspace/a.txt", type: "file", content: "A\n" },
        { path: `workspace/${long}`, type: "file", content: "ünïcode" },
      ]);
      expect(tar.length % 10240).toBe(0);
      writeFileSync(path.join(dir, "x.tar"), tar);
      mkdirSync(path.join(dir, "out"));
      const r = spawnSync("tar", ["-xf", path.join(dir, "x.tar"), "-C", path.join(dir, "out")]);
      expect(r.stderr.toString()).toBe("");
      expect(readFileSync(path.join(dir, "out/workspace/a.txt"), "utf8")).toBe("A\n");
      expect(readFileSync(path.join(dir, "out/workspace", long), "utf8")).toBe("ünïcode");
      spawnSync("tar", ["-cf", path.join(dir, "y.tar"), "-C", path.join(dir, "out"), "workspace"]);
      const entries = readTar(readFileSync(path.join(dir, "y.tar")));
      const files = Object.fromEntries(entries.filter((e) => e.type === "file").map((e) => [e.path, Buffer.from(e.content!).toString("utf8")]));
      expect(files).toEqual({ "workspace/a.txt": "A\n", [`workspace/${long}`]: "ünïcode" });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("quantities and names", () => {
  it("converts CPU and memory quantities", () => {
    expect(cpuToNumber("500m")).toBe(0.5);
    expect(cpuToNumber("2")).toBe(2);
    expect(cpuToNumber(1.5)).toBe(1.5);
    expect(memoryToBytes("512Mi")).toBe(512 * 1024 ** 2);
    expect(memoryToBytes("1G")).toBe(1e9);
    expect(memoryToBytes(4096)).toBe(4096);
  });
  it("makes label values and DNS names", () => {
    expect(labelValue("my worker/1:host")).toBe("my-worker-1-host");
    expect(labelValue("-" + "a".repeat(80))).toHaveLength(63);
    expect(dnsName("Task_ID.1", 40)).toBe("task-id-1");
  });
});

describe("Semaphore", () => {
  it("admits max holders and hands slots to waiters in order", async () => {
    const s = new Semaphore(1);
    const r1 = await s.acquire();
    const order: number[] = [];
    const p2 = s.acquire().then((r) => (order.push(2), r));
    const p3 = s.acquire().then((r) => (order.push(3), r));
    await new Promise((r) => setTimeout(r, 10));
    expect(order).toEqual([]);
    r1();
    r1(); // twice is harmless
    (await p2)();
    (await p3)();
    expect(order).toEqual([2, 3]);
    expect(s.inUse).toBe(0);
  });
});

describe("RuntimeSpec and WorkerEnv for container runtimes", () => {
  it("keeps local tasks as they were and validates the container fields", () => {
    expect(RuntimeSpec.parse({})).toEqual({ kind: "local", files: {}, prepare: [], image: null, keep: false, isolation: "none", egress: [] });
    expect(Task.parse({ instruction: "x", agent: { harness: "command", command: ["true"] } }).runtime.kind).toBe("local");
    expect(RuntimeSpec.parse({ image: "ignored:1" }).kind).toBe("local");
    const k = RuntimeSpec.parse({ kind: "kubernetes", image: "python:3.12", resources: { cpu: "500m", memory: "1Gi" }, service_account: "sb", node_selector: { pool: "a" }, workdir: "/testbed" });
    expect(k).toMatchObject({ kind: "kubernetes", workdir: "/testbed", resources: { cpu: "500m", memory: "1Gi" } });
    const issues = (v: unknown) => RuntimeSpec.safeParse(v).error?.issues.map((i) => `${i.path.join(".")}: ${i.message}`) ?? [];
    expect(issues({ kind: "docker" })).toEqual(["image: runtime.kind docker needs an image"]);
    expect(issues({ kind: "docker", image: "x", service_account: "a" })).toEqual(["service_account: only for runtime.kind kubernetes"]);
    expect(issues({ kind: "docker", image: "x", network: "my-net" })[0]).toMatch(/^network: Invalid option: expected one of "sealed"\|"host"/);
    expect(issues({ kind: "local", resources: { cpu: 1 } })).toEqual(["resources: only for runtime.kind docker or kubernetes"]);
    expect(issues({ kind: "docker", image: "x", isolation: "bwrap" })[0]).toMatch(/^isolation/);
    expect(issues({ kind: "docker", image: "x", resources: { memory: "lots" } })[0]).toMatch(/^resources\.memory/);
    expect(issues({ kind: "docker", image: "x", workdir: "relative" })[0]).toMatch(/^workdir/);
  });

  it('runtime.network is "sealed" wherever the runtime can seal it, and egress only where it is sealed', () => {
    const net = (v: Record<string, unknown>) => runtimeNetwork(RuntimeSpec.parse(v));
    expect(net({})).toBe("host");
    expect(net({ isolation: "bwrap" })).toBe("sealed");
    expect(net({ isolation: "bwrap", network: "host" })).toBe("host");
    expect(net({ kind: "docker", image: "x" })).toBe("sealed");
    expect(net({ kind: "docker", image: "x", network: "host" })).toBe("host");
    expect(net({ kind: "kubernetes", image: "x" })).toBe("sealed");
    expect(RuntimeSpec.parse({ isolation: "bwrap", egress: ["10.0.0.0/8", "pypi.org", "*.github.com", "::1", "*"] }).egress).toHaveLength(5);
    const issues = (v: unknown) => RuntimeSpec.safeParse(v).error?.issues.map((i) => `${i.path.join(".")}: ${i.message}`) ?? [];
    expect(issues({ network: "sealed" })).toEqual(['network: a local sandbox without isolation shares the host\'s network: "sealed" needs runtime.isolation "bwrap" (or a container runtime)']);
    expect(issues({ kind: "kubernetes", image: "x", network: "host" })[0]).toMatch(/^network: a pod's network is the cluster's/);
    expect(issues({ isolation: "bwrap", network: "host", egress: ["1.2.3.4"] })).toEqual(['egress: only for runtime.network "sealed" (a "host" network reaches everything the host does)']);
    expect(issues({ isolation: "bwrap", egress: ["http://x/"] })[0]).toMatch(/^egress\.0: must be a CIDR/);
    expect(issues({ isolation: "bwrap", egress: ["a b"] })[0]).toMatch(/^egress\.0/);
  });

  it("reads the runtime settings of a worker, with local only by default", () => {
    const d = parseEnv(WorkerEnv, {});
    expect(d).toMatchObject({ ROLLGATE_RUNTIMES: ["local"], DOCKER_HOST: "unix:///var/run/docker.sock", ROLLGATE_DOCKER_NETWORK: "bridge", ROLLGATE_K8S_NAMESPACE: "rollgate-sandboxes", ROLLGATE_K8S_START_TIMEOUT_S: 300 });
    expect(d.ROLLGATE_K8S_MAX_PODS).toBeUndefined();
    expect(parseEnv(WorkerEnv, { ROLLGATE_RUNTIMES: "docker, kubernetes", ROLLGATE_K8S_MAX_PODS: "8" })).toMatchObject({ ROLLGATE_RUNTIMES: ["docker", "kubernetes"], ROLLGATE_K8S_MAX_PODS: 8 });
    expect(() => parseEnv(WorkerEnv, { ROLLGATE_RUNTIMES: "podman" })).toThrow(/ROLLGATE_RUNTIMES: .*unknown: podman/);
    expect(() => parseEnv(WorkerEnv, { DOCKER_HOST: "docker.sock" })).toThrow(/DOCKER_HOST/);
    expect(() => parseEnv(WorkerEnv, { ROLLGATE_K8S_NAMESPACE: "Bad_NS" })).toThrow(/ROLLGATE_K8S_NAMESPACE/);
    expect(() => parseEnv(WorkerEnv, { ROLLGATE_K8S_MAX_PODS: "0" })).toThrow(/ROLLGATE_K8S_MAX_PODS/);
    expect(parseEnv(WorkerEnv, { ROLLGATE_SANDBOX_BINDS: "/opt/conda, /srv/tools" }).ROLLGATE_SANDBOX_BINDS).toEqual(["/opt/conda", "/srv/tools"]);
    expect(() => parseEnv(WorkerEnv, { ROLLGATE_SANDBOX_BINDS: "relative/path" })).toThrow(/ROLLGATE_SANDBOX_BINDS/);
    expect(() => parseEnv(WorkerEnv, { ROLLGATE_SANDBOX_EGRESS_DENY: "10.0.0.0/8,http://x" })).toThrow(/ROLLGATE_SANDBOX_EGRESS_DENY/);
  });
});
