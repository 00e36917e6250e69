// Summary of a V8 .cpuprofile (node --cpu-prof): self time by function and by package.
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";

/** @typedef {{ id: number, callFrame: { functionName: string, url: string, lineNumber: number } }} ProfileNode */
/** @typedef {{ nodes: ProfileNode[], startTime: number, samples: number[], timeDeltas: number[] }} CpuProfile the .cpuprofile format */
/** @typedef {{ name: string, self_ms: number, pct: number }} Ranked */
/** @typedef {{ total_ms: number, busy_pct: number, functions: Ranked[], packages: Ranked[] }} ProfileSummary */

/** @param {string} url */
function packageOf(url) {
  if (!url) return "(native / V8)";
  if (url.startsWith("node:")) return "node core";
  const nm = url.lastIndexOf("/node_modules/");
  if (nm >= 0) {
    const rest = url.slice(nm + "/node_modules/".length).split("/");
    return rest[0].startsWith("@") ? `${rest[0]}/${rest[1]}` : rest[0];
  }
  const m = /\/(apps|packages)\/([^/]+)\//.exec(url);
  return m ? `rollgate ${m[1]}/${m[2]}` : url;
}

/**
 * `skipMs`: samples in the first `skipMs` of the profile (start-up: module loading) are left out.
 * @param {string} file
 * @returns {ProfileSummary}
 */
export function summarizeProfile(file, { top = 15, skipMs = 0 } = {}) {
  /** @type {CpuProfile} */
  const prof = JSON.parse(readFileSync(file, "utf8"));
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  /** @type {Map<number, number>} */
  const self = new Map();
  let t = prof.startTime;
  for (let i = 0; i < prof.samples.length; i++) {
    t += prof.timeDeltas[i] ?? 0;
    if (t - prof.startTime < skipMs * 1000) continue;
    self.set(prof.samples[i], (self.get(prof.samples[i]) ?? 0) + (prof.timeDeltas[i] ?? 0));
  }
  const total = [...self.values()].reduce((a, b) => a + b, 0);
  /** @type {Map<string, number>} */
  const fns = new Map();
  /** @type {Map<string, number>} */
  const pkgs = new Map();
  for (const [id, us] of self) {
    const { callFrame: f } = /** @type {ProfileNode} */ (byId.get(id));
    const file = f.url ? f.url.replace(/^file:\/\//, "").replace(/^.*\/(node_modules|apps|packages)\//, "$1/") : "";
    const key = `${f.functionName || "(anonymous)"} ${file ? `${file}:${f.lineNumber + 1}` : ""}`.trim();
    fns.set(key, (fns.get(key) ?? 0) + us);
    const pkg = f.functionName === "(garbage collector)" ? "(garbage collector)" : f.functionName === "(idle)" ? "(idle)" : f.functionName === "(program)" ? "(program)" : packageOf(f.url);
    pkgs.set(pkg, (pkgs.get(pkg) ?? 0) + us);
  }
  const rank = (/** @type {Map<string, number>} */ m) =>
    [...m.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([name, us]) => ({ name, self_ms: Math.round(us / 1000), pct: Math.round((1000 * us) / total) / 10 }));
  const idle = pkgs.get("(idle)") ?? 0;
  return { total_ms: Math.round(total / 1000), busy_pct: Math.round((1000 * (total - idle)) / total) / 10, functions: rank(fns), packages: rank(pkgs) };
}

/** @param {string} dir */
export function newestProfile(dir) {
  const files = readdirSync(dir).filter((f) => f.endsWith(".cpuprofile"));
  if (files.length === 0) return null;
  return path.join(dir, /** @type {string} */ (files.sort().at(-1)));
}

/**
 * Prints a profile summary as two tables (by package, top functions) under `title`.
 * @param {string} title
 * @param {ProfileSummary} summary
 * @param {typeof import("./stats.mjs").printTable} printTable
 */
export function printProfile(title, summary, printTable) {
  printTable(`${title}: self time by package`, ["package", "ms", "%"], summary.packages.map((p) => [p.name, p.self_ms, p.pct]));
  printTable(`${title}: top self-time functions`, ["function", "ms", "%"], summary.functions.map((f) => [f.name, f.self_ms, f.pct]));
}
