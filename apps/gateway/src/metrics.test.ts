/**
 * GET /metrics: scraped before and after real traffic (in-process gateway, in-process engine-sim
 * on a real port, real Redis under a per-test key prefix).
 */
import type { CompletionRecord } from "@rollgate/protocol";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startSimFleet, type SimFleet } from "./__fixtures__/harness.js";

let fleet: SimFleet;
const gateway = (env: Record<string, string> = {}) => fleet.gateway({ env });

type Sample = { name: string; labels: Record<string, string>; value: number };

function parseMetrics(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** The value of the one sample of `name` whose labels include `labels` (0 when absent). */
function value(samples: Sample[], name: string, labels: Record<string, string> = {}): number {
  const found = samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  expect(found.length, `${name} ${JSON.stringify(labels)}: ${found.length} samples`).toBeLessThanOrEqual(1);
  return found[0]?.value ?? 0;
}

async function scrape(app: FastifyInstance, headers: Record<string, string> = {}): Promise<Sample[]> {
  const res = await app.inject({ url: "/metrics", headers });
  expect(res.statusCode).toBe(200);
  expect(res.headers["content-type"]).toMatch(/^text\/plain/);
  return parseMetrics(res.body);
}

async function openSession(app: FastifyInstance, body: Record<string, unknown> = {}, headers: Record<string, string> = {}) {
  const res = await app.inject({ method: "POST", url: "/v1/sessions", payload: body, headers });
  expect(res.statusCode).toBe(201);
  return res.json() as { id: string; token: string };
}

async function records(app: FastifyInstance, sid: string): Promise<CompletionRecord[]> {
  return ((await app.inject({ url: `/v1/sessions/${sid}/completions` })).json() as { completions: CompletionRecord[] }).completions;
}

async function until(check: () => Promise<boolean>, ms = 3000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error("condition not reached in time");
    await new Promise((r) => setTimeout(r, 50));
  }
}

beforeAll(async () => {
  fleet = await startSimFleet("metrics", { model: "Qwen/Qwen3-8B" });
});

afterAll(() => fleet.close());

describe("GET /metrics", () => {
  it("counts LLM calls, tokens and latencies by protocol and rank as calls happen", async () => {
    const app = await gateway();
    const s = await openSession(app);
    const rank = String(((await app.inject({ url: `/v1/sessions/${s.id}` })).json() as { assignment: { dp_rank: number } }).assignment.dp_rank);
    const before = await scrape(app);
    const openai = { protocol: "openai_chat", engine: "0", dp_rank: rank };
    const anthropic = { protocol: "anthropic_messages", engine: "0", dp_rank: rank };
    expect(value(before, "rollgate_llm_calls_total", openai)).toBe(0);
    expect(value(before, "rollgate_sessions_open")).toBe(1);

    for (const q of ["one", "two"]) {
      const res = await app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}` },
        payload: { messages: [{ role: "user", content: q }], max_tokens: 8 },
      });
      expect(res.statusCode).toBe(200);
    }
    const msg = await app.inject({
      method: "POST",
      url: `/s/${s.id}/v1/messages`,
      headers: { "x-api-key": s.token },
      payload: { model: "m", max_tokens: 8, messages: [{ role: "user", content: "three" }] },
    });
    expect(msg.statusCode).toBe(200);

    const after = await scrape(app);
    const recs = await records(app, s.id);
    expect(recs).toHaveLength(3);
    const sum = (protocol: string, k: "prompt_tokens" | "completion_tokens" | "cached_tokens") =>
      recs.filter((r) => r.protocol === protocol).reduce((n, r) => n + r.usage[k], 0);

    expect(value(after, "rollgate_llm_calls_total", openai)).toBe(2);
    expect(value(after, "rollgate_llm_calls_total", anthropic)).toBe(1);
    for (const [kind, field] of [["prompt", "prompt_tokens"], ["completion", "completion_tokens"], ["cached", "cached_tokens"]] as const) {
      expect(value(after, "rollgate_llm_tokens_total", { ...openai, kind })).toBe(sum("openai_chat", field));
      expect(value(after, "rollgate_llm_tokens_total", { ...anthropic, kind })).toBe(sum("anthropic_messages", field));
    }
    expect(value(after, "rollgate_llm_tokens_total", { ...openai, kind: "prompt" })).toBeGreaterThan(0);
    expect(value(after, "rollgate_llm_tokens_total", { ...openai, kind: "completion" })).toBeGreaterThan(0);
    // Histograms: one engine-latency sample per call; one overhead sample per agent request.
    expect(value(after, "rollgate_engine_latency_seconds_count", openai)).toBe(2);
    const engineSum = recs.filter((r) => r.protocol === "openai_chat").reduce((n, r) => n + r.latency_ms / 1000, 0);
    expect(value(after, "rollgate_engine_latency_seconds_sum", openai)).toBeCloseTo(engineSum, 6);
    expect(value(after, "rollgate_gateway_overhead_seconds_count", { protocol: "openai_chat" })).toBe(2);
    expect(value(after, "rollgate_gateway_overhead_seconds_count", { protocol: "anthropic_messages" })).toBe(1);
    expect(value(after, "rollgate_gateway_overhead_seconds_sum", { protocol: "openai_chat" })).toBeGreaterThan(0);
    expect(value(after, "rollgate_http_requests_total", { method: "POST", route: "/s/:sid/v1/chat/completions", status_code: "200" })).toBe(2);
    // Ranks: both up; this session's rank holds it.
    expect(value(after, "rollgate_engine_rank_up", { engine: "0", dp_rank: "0" })).toBe(1);
    expect(value(after, "rollgate_engine_rank_up", { engine: "0", dp_rank: "1" })).toBe(1);
    expect(value(after, "rollgate_rank_sessions", { engine: "0", dp_rank: rank })).toBe(1);

    await app.inject({ method: "POST", url: `/v1/sessions/${s.id}/close` });
    expect(value(await scrape(app), "rollgate_sessions_open")).toBe(0);
    await app.close();
  });

  it("shows the pause state and the weight version", async () => {
    const app = await gateway();
    const paused = async () => value(await scrape(app), "rollgate_inference_paused");
    expect(await paused()).toBe(0);
    const p = await app.inject({ method: "POST", url: "/admin/inference/pause", payload: { mode: "drain", timeout_s: 1 } });
    expect(p.statusCode).toBe(200);
    await until(async () => (await paused()) === 1);
    const r = await app.inject({ method: "POST", url: "/admin/inference/resume" });
    expect(r.statusCode).toBe(200);
    await until(async () => (await paused()) === 0);

    expect((await scrape(app)).filter((x) => x.name === "rollgate_weight_version_info")).toEqual([]);
    expect((await app.inject({ method: "POST", url: "/admin/weights", payload: { version: "step-7" } })).statusCode).toBe(200);
    expect(value(await scrape(app), "rollgate_weight_version_info", { version: "step-7" })).toBe(1);
    await app.inject({ method: "POST", url: "/admin/weights", payload: { version: "step-8" } });
    const versions = (await scrape(app)).filter((x) => x.name === "rollgate_weight_version_info");
    expect(versions).toEqual([{ name: "rollgate_weight_version_info", labels: { version: "step-8" }, value: 1 }]);
    await app.close();
  });

  it("shows queue depth, oldest job age, tasks by status and callback state", async () => {
    const app = await gateway();
    const before = await scrape(app);
    expect(value(before, "rollgate_queue_jobs", { queue: "rollouts", state: "waiting" })).toBe(0);
    expect(value(before, "rollgate_queue_oldest_waiting_age_seconds", { queue: "rollouts" })).toBe(0);
    expect(value(before, "rollgate_tasks", { status: "queued" })).toBe(0);

    const task = { instruction: "x", agent: { harness: "command", command: ["true"] } };
    for (const id of ["a", "b"]) {
      const res = await app.inject({ method: "POST", url: "/v1/tasks", payload: { ...task, id } });
      expect(res.statusCode).toBe(202);
    }
    const withCallback = { ...task, id: "c", callback: { url: "http://127.0.0.1:9/cb", secret: "s3cret" } };
    expect((await app.inject({ method: "POST", url: "/v1/tasks", payload: withCallback })).statusCode).toBe(202);
    await new Promise((r) => setTimeout(r, 30));

    const after = await scrape(app);
    // No worker runs in this test: the jobs wait.
    expect(value(after, "rollgate_queue_jobs", { queue: "rollouts", state: "waiting" })).toBe(3);
    expect(value(after, "rollgate_queue_jobs", { queue: "callbacks", state: "waiting" })).toBe(0);
    expect(value(after, "rollgate_queue_oldest_waiting_age_seconds", { queue: "rollouts" })).toBeGreaterThan(0);
    expect(value(after, "rollgate_tasks", { status: "queued" })).toBe(3);
    expect(value(after, "rollgate_tasks", { status: "completed" })).toBe(0);
    expect(value(after, "rollgate_tasks_scanned")).toBe(3);
    expect(value(after, "rollgate_tasks_indexed")).toBe(3);
    expect(value(after, "rollgate_callbacks", { state: "pending" })).toBe(1);

    // Cancelling a queued task ends it at once.
    expect((await app.inject({ method: "DELETE", url: "/v1/tasks/a" })).statusCode).toBe(200);
    const later = await scrape(app);
    expect(value(later, "rollgate_tasks", { status: "queued" })).toBe(2);
    expect(value(later, "rollgate_tasks", { status: "cancelled" })).toBe(1);
    expect(value(later, "rollgate_queue_jobs", { queue: "rollouts", state: "waiting" })).toBe(2);
    expect(value(later, "rollgate_metrics_refresh_errors_total", { source: "tasks" })).toBe(0);
    await app.close();
  });

  it("requires the API key when one is configured", async () => {
    const app = await gateway({ ROLLGATE_API_KEY: "metrics-key" });
    expect((await app.inject({ url: "/metrics" })).statusCode).toBe(401);
    const samples = await scrape(app, { authorization: "Bearer metrics-key" });
    expect(samples.some((s) => s.name === "rollgate_sessions_open")).toBe(true);
    await app.close();
  });

  it("counts each call once however the scrapes fall between calls", async () => {
    const app = await gateway();
    const s = await openSession(app);
    const call = async () => {
      const res = await app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}` },
        payload: { messages: [{ role: "user", content: "hi" }], max_tokens: 4 },
      });
      expect(res.statusCode).toBe(200);
    };
    const calls = (x: Sample[]) => x.filter((m) => m.name === "rollgate_llm_calls_total").reduce((n, m) => n + m.value, 0);
    const completions = (x: Sample[]) => value(x, "rollgate_http_requests_total", { method: "POST", route: "/s/:sid/v1/chat/completions", status_code: "200" });
    const completionTokens = (x: Sample[]) => x.filter((m) => m.name === "rollgate_llm_tokens_total" && m.labels.kind === "completion").reduce((n, m) => n + m.value, 0);
    await call();
    const first = await scrape(app);
    expect([calls(first), completions(first)]).toEqual([1, 1]);
    // A second scrape with no call between: the same counts, not counted again.
    expect(calls(await scrape(app))).toBe(1);
    await call();
    await call();
    const third = await scrape(app);
    expect([calls(third), completions(third)]).toEqual([3, 3]);
    const recs = await records(app, s.id);
    expect(completionTokens(third)).toBe(recs.reduce((n, r) => n + r.usage.completion_tokens, 0));
    await app.close();
  });

  it("keeps one registry per gateway: two gateways in one process count separately", async () => {
    const a = await gateway();
    const b = await gateway();
    const s = await openSession(a);
    const res = await a.inject({
      method: "POST",
      url: `/s/${s.id}/v1/chat/completions`,
      headers: { authorization: `Bearer ${s.token}` },
      payload: { messages: [{ role: "user", content: "hi" }], max_tokens: 4 },
    });
    expect(res.statusCode).toBe(200);
    const total = (x: Sample[]) => x.filter((m) => m.name === "rollgate_llm_calls_total").reduce((n, m) => n + m.value, 0);
    expect(total(await scrape(a))).toBe(1);
    expect(total(await scrape(b))).toBe(0);
    await a.close();
    await b.close();
  });
});
