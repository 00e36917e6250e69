// Closed-loop load with autocannon (as a library). Each connection is its own autocannon instance,
// so each can carry its own URL and headers (one rollgate session per connection); the client
// cost is the same whatever the target. Latencies are taken from autocannon's per-response event
// (float milliseconds), not its integer-millisecond histogram, so sub-millisecond overheads show.
import { performance } from "node:perf_hooks";
import autocannon from "autocannon";

/** @typedef {{ url: string, headers?: Record<string, string>, body?: string, maxRequests?: number, rate?: number }} Target one connection's requests (`rate`: at most this many per second) */
/** @typedef {{ ok: number, non2xx: number, errors: number, firstBadStatus: number | null }} Counts */

/**
 * @param {Target & { durationS: number }} opts
 * @param {number[]} latencies
 * @param {Counts} counts
 * @returns {Promise<autocannon.Result>}
 */
function runOne(opts, latencies, counts) {
  return new Promise((resolve, reject) => {
    const inst = autocannon(
      {
        url: opts.url,
        method: "POST",
        headers: { "content-type": "application/json", ...opts.headers },
        body: opts.body,
        connections: 1,
        pipelining: 1,
        duration: opts.durationS,
        timeout: 30,
        // A run is bounded in count as well as in time.
        maxConnectionRequests: opts.maxRequests ?? 100_000,
        ...(opts.rate ? { connectionRate: opts.rate } : {}),
      },
      (err, res) => (err ? reject(err) : resolve(res)),
    );
    inst.on("response", (_client, statusCode, _bytes, responseTime) => {
      if (statusCode >= 200 && statusCode < 300) {
        latencies.push(responseTime);
        counts.ok++;
      } else {
        counts.non2xx++;
        if (counts.firstBadStatus === null) counts.firstBadStatus = statusCode;
      }
    });
    inst.on("reqError", () => counts.errors++);
  });
}

/**
 * `targets`: one {url, headers, body} per connection. Returns throughput (2xx/s), latency
 * percentiles (ms) and error counts.
 * @param {readonly Target[]} targets
 * @param {number} durationS
 */
export async function load(targets, durationS) {
  /** @type {number[]} */
  const latencies = [];
  /** @type {Counts} */
  const counts = { ok: 0, non2xx: 0, errors: 0, firstBadStatus: null };
  const t0 = performance.now();
  await Promise.all(targets.map((t) => runOne({ ...t, durationS }, latencies, counts)));
  const elapsedS = (performance.now() - t0) / 1000;
  return { latencies, ...counts, elapsedS, rps: counts.ok / elapsedS };
}
