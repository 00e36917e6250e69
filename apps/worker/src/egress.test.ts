/**
 * The egress policy for callbacks and http evaluators: link-local and metadata are refused by
 * default, loopback is allowed, ROLLGATE_CALLBACK_ALLOW narrows it, and the connection goes to the
 * address that was checked (a name that re-resolves elsewhere afterwards does not move it).
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EgressDenied, checkDestination, egressRequest, hostAddressDenials, infrastructureDenials, parseEgressPolicy, sandboxEgressPolicy, type Resolver } from "./egress.js";

const fixed =
  (...addresses: string[]): Resolver =>
  async () =>
    addresses.map((address) => ({ address, family: address.includes(":") ? 6 : 4 }));

describe("the default policy", () => {
  const policy = parseEgressPolicy();

  it.each([
    ["http://169.254.169.254/latest/meta-data/", "169.254.169.254"],
    ["http://169.254.1.2:8080/x", "169.254.1.2"],
    ["http://[fe80::1]/", "fe80::1"],
    ["http://[fd00:ec2::254]/", "fd00:ec2::254"],
    ["http://[::ffff:169.254.169.254]/", "169.254.169.254"],
    ["http://100.100.100.200/", "100.100.100.200"],
  ])("refuses %s (link-local / metadata)", async (url, addr) => {
    await expect(checkDestination(policy, url, "callback.url")).rejects.toThrow(EgressDenied);
    await expect(checkDestination(policy, url, "callback.url")).rejects.toThrow(`resolves to ${addr}, which the egress policy denies`);
  });

  it("refuses metadata host names without resolving them, and names that resolve to metadata", async () => {
    let asked = 0;
    const counting: Resolver = async () => {
      asked++;
      return [{ address: "127.0.0.1", family: 4 }];
    };
    for (const host of ["metadata.google.internal", "METADATA.GOOGLE.INTERNAL.", "metadata.goog", "metadata"]) {
      await expect(checkDestination(policy, `http://${host}/computeMetadata/v1/`, "callback.url", counting)).rejects.toThrow(/denied/);
    }
    expect(asked).toBe(0);
    await expect(checkDestination(policy, "http://evil.example/", "callback.url", fixed("169.254.169.254"))).rejects.toThrow(
      /evil\.example resolves to 169\.254\.169\.254/,
    );
    // One bad address among several is enough to refuse.
    await expect(checkDestination(policy, "http://mixed.example/", "callback.url", fixed("10.0.0.5", "169.254.169.254"))).rejects.toThrow(EgressDenied);
  });

  it("allows loopback, private and public addresses", async () => {
    expect(await checkDestination(policy, "http://127.0.0.1:9000/rollouts", "callback.url")).toMatchObject({ address: "127.0.0.1", family: 4 });
    expect(await checkDestination(policy, "http://[::1]:9000/", "callback.url")).toMatchObject({ address: "::1", family: 6 });
    expect(await checkDestination(policy, "http://trainer:9000/", "callback.url", fixed("10.1.2.3"))).toMatchObject({ host: "trainer", address: "10.1.2.3" });
    expect(await checkDestination(policy, "https://example.com/", "callback.url", fixed("93.184.215.14"))).toMatchObject({ address: "93.184.215.14" });
  });

  it("refuses what is not http(s)", async () => {
    await expect(checkDestination(policy, "file:///etc/passwd", "callback.url")).rejects.toThrow(/http\(s\)/);
    await expect(checkDestination(policy, "not a url", "callback.url")).rejects.toThrow(/not a URL/);
  });
});

describe("a configured allowlist", () => {
  const policy = parseEgressPolicy("10.0.0.0/8, trainer.internal, *.rl.example", "10.9.0.0/16");

  it("allows only listed networks and names; deny wins; metadata stays refused even if listed", async () => {
    expect(await checkDestination(policy, "http://10.1.2.3/", "callback.url")).toMatchObject({ address: "10.1.2.3" });
    expect(await checkDestination(policy, "http://trainer.internal/", "callback.url", fixed("192.168.1.1"))).toMatchObject({ address: "192.168.1.1" });
    expect(await checkDestination(policy, "http://a.b.rl.example/", "callback.url", fixed("172.16.0.1"))).toMatchObject({ host: "a.b.rl.example" });
    await expect(checkDestination(policy, "http://127.0.0.1:9000/", "callback.url")).rejects.toThrow(/not in ROLLGATE_CALLBACK_ALLOW/);
    await expect(checkDestination(policy, "http://other.example/", "callback.url", fixed("10.2.2.2", "8.8.8.8"))).rejects.toThrow(/not in ROLLGATE_CALLBACK_ALLOW/);
    await expect(checkDestination(policy, "http://10.9.1.1/", "callback.url")).rejects.toThrow(/denies/);
    const listed = parseEgressPolicy("169.254.0.0/16,metadata.google.internal");
    await expect(checkDestination(listed, "http://169.254.169.254/", "callback.url")).rejects.toThrow(EgressDenied);
    await expect(checkDestination(listed, "http://metadata.google.internal/", "callback.url")).rejects.toThrow(EgressDenied);
  });

  it("rejects malformed rules at start-up", () => {
    expect(() => parseEgressPolicy("10.0.0.0/40")).toThrow(/bad CIDR/);
    expect(() => parseEgressPolicy("http://x")).toThrow(/bad egress rule/);
  });
});

describe("egressRequest", () => {
  let server: http.Server;
  let port = 0;
  const hits: string[] = [];
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      hits.push(`${req.headers.host} ${req.url}`);
      res.end("ok");
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it("connects to the address it checked, whatever the name resolves to later (no DNS rebinding)", async () => {
    let calls = 0;
    // First answer: loopback (allowed). Any later lookup would say metadata.
    const rebinding: Resolver = async () => [{ address: calls++ === 0 ? "127.0.0.1" : "169.254.169.254", family: 4 }];
    const { res, close } = await egressRequest(`http://rebind.test:${port}/rollouts`, "callback.url", { method: "POST", body: "{}" }, parseEgressPolicy(), rebinding);
    expect(res.statusCode).toBe(200);
    expect(await res.body.text()).toBe("ok");
    await close();
    expect(calls).toBe(1);
    expect(hits.at(-1)).toBe(`rebind.test:${port} /rollouts`);
  });

  it("sends nothing to a denied destination", async () => {
    const before = hits.length;
    await expect(
      egressRequest(`http://sneaky.test:${port}/`, "evaluator.url", { method: "POST" }, parseEgressPolicy(), fixed("169.254.169.254")),
    ).rejects.toThrow(EgressDenied);
    await expect(egressRequest(`http://127.0.0.1:${port}/`, "callback.url", { method: "POST" }, parseEgressPolicy("10.0.0.0/8"))).rejects.toThrow(
      /not in ROLLGATE_CALLBACK_ALLOW/,
    );
    expect(hits.length).toBe(before);
  });
});

describe("a sealed sandbox's egress (runtime.egress)", () => {
  it("is nothing by default, and what the task names otherwise", async () => {
    expect(sandboxEgressPolicy([])).toBeNull();
    const p = sandboxEgressPolicy(["pypi.org", "*.github.com", "93.184.0.0/16"])!;
    await expect(checkDestination(p, "https://pypi.org/simple/", "runtime.egress", fixed("151.101.0.223"))).resolves.toMatchObject({ address: "151.101.0.223" });
    await expect(checkDestination(p, "https://api.github.com/", "runtime.egress", fixed("140.82.112.5"))).resolves.toBeDefined();
    await expect(checkDestination(p, "http://93.184.1.1/", "runtime.egress")).resolves.toBeDefined();
    await expect(checkDestination(p, "http://8.8.8.8/", "runtime.egress")).rejects.toThrow(/not in runtime.egress \(pypi.org,\*.github.com,93.184.0.0\/16\)/);
  });

  it("never reaches loopback, metadata or the worker's infrastructure, even with *", async () => {
    const p = sandboxEgressPolicy(["*"], ["redis.internal", "10.0.0.7"])!;
    for (const [url, addr] of [
      ["http://127.0.0.1:6379/", "127.0.0.1"],
      ["http://localhost:8080/", "127.0.0.1"],
      ["http://[::1]:8000/", "::1"],
      ["http://0.0.0.0:8000/", "0.0.0.0"],
      ["http://169.254.169.254/", "169.254.169.254"],
      ["http://gateway.example:8080/", "10.0.0.7"],
      ["http://redis.internal:6379/", "10.0.0.8"],
    ] as const) {
      await expect(checkDestination(p, url, "runtime.egress", fixed(addr)), url).rejects.toThrow(EgressDenied);
    }
    await expect(checkDestination(p, "https://example.org/", "runtime.egress", fixed("93.184.215.14"))).resolves.toBeDefined();
  });

  it("hostAddressDenials: every address of the worker's host, so * does not reach its services by the LAN or bridge address", async () => {
    const ifaces = {
      lo: [{ address: "127.0.0.1", netmask: "255.0.0.0", family: "IPv4", mac: "00:00:00:00:00:00", internal: true, cidr: "127.0.0.1/8" }],
      eth0: [
        { address: "10.20.30.40", netmask: "255.255.0.0", family: "IPv4", mac: "02:00:00:00:00:01", internal: false, cidr: "10.20.30.40/16" },
        { address: "2001:db8::5", netmask: "ffff:ffff:ffff:ffff::", family: "IPv6", mac: "02:00:00:00:00:01", internal: false, cidr: "2001:db8::5/64", scopeid: 0 },
      ],
      docker0: [{ address: "172.17.0.1", netmask: "255.255.0.0", family: "IPv4", mac: "02:00:00:00:00:02", internal: false, cidr: "172.17.0.1/16" }],
    } as const;
    const denied = hostAddressDenials(ifaces as unknown as Parameters<typeof hostAddressDenials>[0]);
    expect(denied.sort()).toEqual(["10.20.30.40", "127.0.0.1", "172.17.0.1", "2001:db8::5"]);
    const policy = sandboxEgressPolicy(["*"], denied)!;
    const resolve: Resolver = async () => [{ address: "198.51.100.7", family: 4 }];
    for (const host of ["10.20.30.40", "172.17.0.1", "[2001:db8::5]", "[::ffff:10.20.30.40]"]) {
      await expect(checkDestination(policy, `http://${host}:6379/`, "runtime.egress", resolve), host).rejects.toBeInstanceOf(EgressDenied);
    }
    await expect(checkDestination(policy, "http://10.20.30.41:6379/", "runtime.egress", resolve)).resolves.toMatchObject({ address: "10.20.30.41" });
  });

  it("infrastructureDenials: the hosts of REDIS_URL and the gateway URL, by name and address", async () => {
    const resolve: Resolver = async (h) => (h === "redis" ? [{ address: "172.18.0.2", family: 4 }] : h === "gw.internal" ? [{ address: "::ffff:10.0.0.9", family: 6 }] : Promise.reject(new Error("ENOTFOUND")));
    expect(
      (await infrastructureDenials(["redis://:pw@redis:6379/0", "http://gw.internal:8080", "redis+cluster://u:p@10.1.0.1:7000,10.1.0.2:7001", "http://nowhere.invalid/"], resolve)).sort(),
    ).toEqual(["10.0.0.9", "10.1.0.1", "10.1.0.2", "172.18.0.2", "gw.internal", "nowhere.invalid", "redis"].sort());
  });
});
