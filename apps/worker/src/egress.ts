import { lookup } from "node:dns/promises";
import { BlockList, isIP } from "node:net";
import os from "node:os";
import { Agent, request } from "undici";

/**
 * Where the worker itself may send HTTP requests a task names: callbacks (`callback.url`, group
 * callbacks) and `http` evaluators. A task is untrusted input, so its URLs must not make the fleet
 * call internal hosts it could not reach otherwise, above all the cloud metadata endpoints (they
 * hand out the host's credentials).
 *
 * The policy: a destination is refused when its host name or any address it resolves to is denied
 * (link-local and metadata always; ROLLGATE_CALLBACK_DENY adds more); otherwise it is allowed when
 * ROLLGATE_CALLBACK_ALLOW is `*` (the default, so loopback and private trainers keep working) or
 * names the host or one of its addresses. The name is resolved once and the connection goes to
 * that checked address (DNS rebinding cannot swap it between check and connect); no redirects.
 */

/** Always refused: link-local (which holds the metadata endpoints of AWS, GCP, Azure, OCI…) and the other metadata addresses. */
export const ALWAYS_DENIED = [
  "169.254.0.0/16",
  "fe80::/10",
  "fd00:ec2::254/128",
  "100.100.100.200/32", // Alibaba Cloud metadata
  "metadata.google.internal",
  "metadata.goog",
  "metadata",
];

export class EgressDenied extends Error {}

interface Rules {
  any: boolean;
  nets: BlockList;
  hosts: Set<string>;
  suffixes: string[];
}

export interface EgressPolicy {
  allow: Rules;
  deny: Rules;
  /** The allow list as configured, for messages. */
  allowText: string;
  /** Where the allow list and the extra denials come from, for messages. */
  allowName: string;
  denyName: string;
}

function normHost(h: string): string {
  return h.replace(/^\[|\]$/g, "").replace(/\.$/, "").toLowerCase();
}

/** `::ffff:169.254.169.254` is 169.254.169.254. */
function normAddress(a: string): { address: string; family: 4 | 6 } {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(a);
  if (m) return { address: m[1]!, family: 4 };
  // The URL parser writes it in hex: [::ffff:a9fe:a9fe].
  const h = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/i.exec(a);
  if (h) {
    const hi = parseInt(h[1]!, 16);
    const lo = parseInt(h[2]!, 16);
    return { address: `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`, family: 4 };
  }
  return { address: a, family: isIP(a) === 6 ? 6 : 4 };
}

function parseRules(list: string[]): Rules {
  const rules: Rules = { any: false, nets: new BlockList(), hosts: new Set(), suffixes: [] };
  for (const raw of list.map((r) => r.trim()).filter(Boolean)) {
    if (raw === "*") {
      rules.any = true;
      continue;
    }
    const [ip, bits] = raw.split("/");
    const family = isIP(ip!);
    if (family) {
      const type = family === 6 ? "ipv6" : "ipv4";
      const prefix = bits === undefined ? (family === 6 ? 128 : 32) : Number(bits);
      if (!Number.isInteger(prefix) || prefix < 0 || prefix > (family === 6 ? 128 : 32)) throw new Error(`bad CIDR ${raw}`);
      rules.nets.addSubnet(ip!, prefix, type);
    } else if (raw.startsWith("*.")) {
      rules.suffixes.push(normHost(raw.slice(1)));
    } else if (bits === undefined && /^[A-Za-z0-9.-]+$/.test(raw)) {
      rules.hosts.add(normHost(raw));
    } else {
      throw new Error(`bad egress rule ${JSON.stringify(raw)}: a CIDR, an IP, a host name, *.domain or *`);
    }
  }
  return rules;
}

/** Parses ROLLGATE_CALLBACK_ALLOW / ROLLGATE_CALLBACK_DENY (comma lists); the built-in denials are always added. */
export function parseEgressPolicy(allow = "*", deny = ""): EgressPolicy {
  const split = (s: string) => s.split(",").filter((r) => r.trim() !== "");
  return {
    allow: parseRules(split(allow)),
    deny: parseRules([...ALWAYS_DENIED, ...split(deny)]),
    allowText: allow,
    allowName: "ROLLGATE_CALLBACK_ALLOW",
    denyName: "link-local / metadata / ROLLGATE_CALLBACK_DENY",
  };
}

/**
 * Never reachable from a sealed sandbox whatever its `runtime.egress` says: the always-denied
 * addresses, and loopback / unspecified addresses (on the worker's host they are the worker's
 * own services: Redis, engines, the gateway).
 */
export const SANDBOX_ALWAYS_DENIED = [...ALWAYS_DENIED, "127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128", "localhost"];

/**
 * The policy of a sealed sandbox's way out: its task's `runtime.egress` rules (the syntax of
 * ROLLGATE_CALLBACK_ALLOW), under SANDBOX_ALWAYS_DENIED plus `deny` (the worker's own
 * infrastructure and ROLLGATE_SANDBOX_EGRESS_DENY). Null when the task allows nothing.
 */
export function sandboxEgressPolicy(allow: string[], deny: string[] = []): EgressPolicy | null {
  if (allow.length === 0) return null;
  return {
    allow: parseRules(allow),
    deny: parseRules([...SANDBOX_ALWAYS_DENIED, ...deny]),
    allowText: allow.join(","),
    allowName: "runtime.egress",
    denyName: "loopback / metadata / the worker's infrastructure / ROLLGATE_SANDBOX_EGRESS_DENY",
  };
}

function hostMatches(r: Rules, host: string): boolean {
  return r.hosts.has(host) || r.suffixes.some((s) => host.endsWith(s));
}

function addressMatches(r: Rules, a: { address: string; family: 4 | 6 }): boolean {
  return r.nets.check(a.address, a.family === 6 ? "ipv6" : "ipv4");
}

export interface Destination {
  host: string;
  address: string;
  family: 4 | 6;
}

export type Resolver = (host: string) => Promise<{ address: string; family: number }[]>;
const systemResolver: Resolver = (host) => lookup(host, { all: true, verbatim: true });

/**
 * The hosts of the worker's own infrastructure (Redis, the gateway), by name and by every
 * address they resolve to now: a sealed sandbox's egress never reaches them. Names that do not
 * resolve are kept by name.
 */
export async function infrastructureDenials(urls: string[], resolve: Resolver = systemResolver): Promise<string[]> {
  const hosts = new Set<string>();
  for (const raw of urls) {
    const m = /^[a-z+]+:\/\/(?:[^@/]*@)?([^/?#]+)/i.exec(raw);
    if (!m) continue;
    // One host or a cluster's comma list, each host[:port] (an IPv6 one in brackets).
    for (const hp of m[1]!.split(",")) hosts.add(normHost(hp.replace(/:\d+$/, "")));
  }
  const out = new Set<string>();
  for (const h of hosts) {
    if (!h) continue;
    if (isIP(h)) {
      out.add(h);
      continue;
    }
    if (/^[A-Za-z0-9.-]+$/.test(h)) out.add(h);
    try {
      for (const a of await resolve(h)) out.add(normAddress(a.address).address);
    } catch {
      // not resolvable from here: refused by name only
    }
  }
  return [...out];
}

/**
 * Every address of the worker's own host (each interface's, as at worker start). Its services
 * (Redis, the gateway, an engine, the worker's ports) often listen on all addresses, so refusing
 * only the ones their URLs name (often loopback) would let a sandbox whose task allows any
 * destination reach them by the host's LAN or bridge address.
 */
export function hostAddressDenials(interfaces: ReturnType<typeof os.networkInterfaces> = os.networkInterfaces()): string[] {
  const out = new Set<string>();
  for (const list of Object.values(interfaces)) for (const a of list ?? []) out.add(normAddress(a.address.replace(/%.*$/, "")).address);
  return [...out];
}

/**
 * Checks a URL against the policy and resolves its host once; throws EgressDenied saying why.
 * `what` names the field in messages (e.g. `callback.url`).
 */
export async function checkDestination(policy: EgressPolicy, rawUrl: string, what: string, resolve: Resolver = systemResolver): Promise<Destination> {
  let url: URL;
  try {
    url = new URL(rawUrl);
  } catch {
    throw new EgressDenied(`${what} is not a URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new EgressDenied(`${what} must be http(s), not ${url.protocol}`);
  const host = normHost(url.hostname);
  if (hostMatches(policy.deny, host)) throw new EgressDenied(`${what} host ${host} is denied by the egress policy (${policy.denyName})`);
  let addresses: { address: string; family: 4 | 6 }[];
  if (isIP(host)) addresses = [normAddress(host)];
  else {
    try {
      addresses = (await resolve(host)).map((a) => normAddress(a.address));
    } catch (err) {
      throw Object.assign(new Error(`${what} host ${host} does not resolve: ${(err as Error).message}`), { transient: true });
    }
    if (addresses.length === 0) throw Object.assign(new Error(`${what} host ${host} does not resolve`), { transient: true });
  }
  for (const a of addresses) {
    if (addressMatches(policy.deny, a)) {
      throw new EgressDenied(`${what} host ${host} resolves to ${a.address}, which the egress policy denies (${policy.denyName})`);
    }
  }
  const chosen = addresses[0]!;
  if (!policy.allow.any && !hostMatches(policy.allow, host) && !addresses.every((a) => addressMatches(policy.allow, a))) {
    throw new EgressDenied(`${what} host ${host} (${chosen.address}) is not in ${policy.allowName} (${policy.allowText})`);
  }
  return { host, ...chosen };
}

/** An undici Agent that connects to the checked address whatever the name resolves to now (TLS still verifies the name). */
function pinnedAgent(d: Destination): Agent {
  type LookupCb = (err: Error | null, address: string | { address: string; family: number }[], family?: number) => void;
  const pinned = (_host: string, options: { all?: boolean } | LookupCb, cb?: LookupCb) => {
    const done = (typeof options === "function" ? options : cb)!;
    if (typeof options === "object" && options?.all) done(null, [{ address: d.address, family: d.family }]);
    else done(null, d.address, d.family);
  };
  return new Agent({ connect: { lookup: pinned as never }, connections: 1 });
}

let current: EgressPolicy = parseEgressPolicy();

/** Sets the worker's policy (main.ts, from ROLLGATE_CALLBACK_ALLOW / ROLLGATE_CALLBACK_DENY). */
export function configureEgress(policy: EgressPolicy): void {
  current = policy;
}

export function egressPolicy(): EgressPolicy {
  return current;
}

type RequestOptions = Omit<NonNullable<Parameters<typeof request>[1]>, "dispatcher">;

/**
 * undici `request` to a destination the policy allows, pinned to the address checked. Throws
 * EgressDenied (never retried: it would be denied again) before anything is sent. The caller reads
 * the body; `close()` frees the connection.
 */
export async function egressRequest(
  rawUrl: string,
  what: string,
  opts: RequestOptions,
  policy: EgressPolicy = current,
  resolve?: Resolver,
): Promise<{ res: Awaited<ReturnType<typeof request>>; close: () => Promise<void> }> {
  const dest = await checkDestination(policy, rawUrl, what, resolve);
  const agent = pinnedAgent(dest);
  try {
    const res = await request(rawUrl, { ...opts, dispatcher: agent });
    return { res, close: () => agent.close().catch(() => undefined) };
  } catch (err) {
    await agent.destroy().catch(() => undefined);
    throw err;
  }
}
