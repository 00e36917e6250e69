// A hostile agent for the sandbox tests: it runs the attempts of the JSON plan in PROBE_PLAN
// (connections, HTTP requests, proxy tunnels, file reads and writes, /proc scans) and prints one
// JSON line per attempt: {"probe": name, ...what happened}. It never throws: every failure is a
// result. Plain node, built-ins only: it runs inside the sandbox with the node it finds there.
// In a plan's strings, $NAME is the variable of the agent's environment and $ORIGIN the origin of
// OPENAI_BASE_URL (where the agent reaches its session).
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";

const TIMEOUT_MS = 4000;
const vars = { ...process.env, ORIGIN: process.env.OPENAI_BASE_URL ? new URL(process.env.OPENAI_BASE_URL).origin : "" };
const expand = (v) =>
  typeof v === "string"
    ? v.replace(/\$([A-Z_][A-Z0-9_]*)/g, (_m, k) => vars[k] ?? "")
    : Array.isArray(v)
      ? v.map(expand)
      : v && typeof v === "object"
        ? Object.fromEntries(Object.entries(v).map(([k, x]) => [k, expand(x)]))
        : v;
const plan = expand(JSON.parse(process.env.PROBE_PLAN ?? "[]"));

function tcp(a) {
  return new Promise((resolve) => {
    const s = net.connect({ host: a.host, port: a.port, path: a.path });
    const done = (r) => {
      s.destroy();
      resolve(r);
    };
    s.setTimeout(TIMEOUT_MS, () => done({ connected: false, code: "TIMEOUT" }));
    s.once("connect", () => done({ connected: true }));
    s.once("error", (e) => done({ connected: false, code: e.code ?? e.message }));
  });
}

/** One HTTP exchange (through `proxy` in absolute form, when given); `chunks`: when each body chunk arrived (ms). */
function httpCall(a) {
  return new Promise((resolve) => {
    const u = new URL(a.url);
    const proxy = a.proxy ? new URL(a.proxy) : null;
    const req = http.request(
      {
        host: proxy?.hostname ?? u.hostname,
        port: proxy?.port ?? u.port,
        path: proxy ? a.url : (a.rawPath ?? `${u.pathname}${u.search}`),
        method: a.method ?? "GET",
        headers: { "content-type": "application/json", ...(a.headers ?? {}) },
        timeout: 30000,
      },
      (res) => {
        const times = [];
        let body = "";
        const t0 = Date.now();
        res.on("data", (c) => {
          times.push(Date.now() - t0);
          body += c;
        });
        res.on("end", () => resolve({ status: res.statusCode, body: body.slice(0, 4000), chunks: times }));
        res.on("error", (e) => resolve({ status: res.statusCode, error: e.code ?? e.message }));
      },
    );
    req.on("timeout", () => req.destroy(new Error("TIMEOUT")));
    req.on("error", (e) => resolve({ status: null, error: e.code ?? e.message }));
    req.end(a.body === undefined ? undefined : JSON.stringify(a.body));
  });
}

/** CONNECT through `proxy`, then one plain GET / over the tunnel. */
function tunnel(a) {
  return new Promise((resolve) => {
    const proxy = new URL(a.proxy);
    const req = http.request({ host: proxy.hostname, port: proxy.port, method: "CONNECT", path: a.target, timeout: TIMEOUT_MS });
    req.on("connect", (res, socket) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        return resolve({ status: res.statusCode });
      }
      let got = "";
      socket.on("data", (b) => (got += b));
      socket.on("end", () => resolve({ status: 200, tunneled: got.split("\r\n")[0] }));
      socket.on("error", (e) => resolve({ status: 200, error: e.code }));
      socket.write(`GET / HTTP/1.1\r\nhost: ${a.target}\r\nconnection: close\r\n\r\n`);
    });
    req.on("response", (res) => {
      let body = "";
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode, body }));
    });
    req.on("error", (e) => resolve({ status: null, error: e.code ?? e.message }));
    req.on("timeout", () => req.destroy(new Error("TIMEOUT")));
    req.end();
  });
}

function read(a) {
  try {
    return { read: true, text: readFileSync(a.path, "utf8").slice(0, 200) };
  } catch (e) {
    return { read: false, code: e.code };
  }
}

function write(a) {
  try {
    writeFileSync(a.path, "written by the agent");
    return { written: true };
  } catch (e) {
    return { written: false, code: e.code };
  }
}

/** Every /proc/<pid>/environ this process can read, and how many hold the needle (given reversed: the plan itself is in this process's environment). */
function scanEnviron(a) {
  const needle = [...a.needleReversed].reverse().join("");
  const pids = readdirSync("/proc").filter((n) => /^\d+$/.test(n));
  let readable = 0;
  let holding = 0;
  for (const pid of pids) {
    try {
      const env = readFileSync(`/proc/${pid}/environ`, "latin1");
      readable++;
      if (env.includes(needle)) holding++;
    } catch {
      // not readable
    }
  }
  return { pids: pids.length, readable, holding };
}

function caps() {
  const status = readFileSync("/proc/self/status", "utf8");
  return { capEff: /CapEff:\s*(\S+)/.exec(status)?.[1], uid: process.getuid?.() };
}

/** This process's own environment (what the worker gave it). */
function env() {
  return { env: process.env };
}

const kinds = { tcp, http: httpCall, tunnel, read, write, environ: scanEnviron, caps, env };
for (const a of plan) {
  let r;
  try {
    r = await kinds[a.kind](a);
  } catch (e) {
    r = { error: String(e) };
  }
  console.log(JSON.stringify({ probe: a.name, ...r }));
}
