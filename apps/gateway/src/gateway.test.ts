/**
 * The gateway in-process (Fastify inject) against an in-process engine-sim on a real port and the
 * real Redis, each test under its own key prefix.
 */
import type { CompletionRecord, Session } from "@rollgate/protocol";
import { buildEngineSim, getSimState } from "@rollgate/engine-sim";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startSimFleet, type SimFleet } from "./__fixtures__/harness.js";

let fleet: SimFleet;
let sim: FastifyInstance;
let simUrl: string;

const gateway = (engines: unknown[], env: Record<string, string> = {}) => fleet.gateway({ engines, env });

async function openSession(app: FastifyInstance, body: Record<string, unknown> = {}) {
  const res = await app.inject({ method: "POST", url: "/v1/sessions", payload: body });
  expect(res.statusCode).toBe(201);
  return res.json() as { id: string; token: string; base_url: string; urls: { openai: string } };
}

function chat(app: FastifyInstance, s: { id: string; token: string }, body: unknown, token = s.token) {
  return app.inject({
    method: "POST",
    url: `/s/${s.id}/v1/chat/completions`,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    payload: typeof body === "string" ? body : JSON.stringify(body),
  });
}

beforeAll(async () => {
  fleet = await startSimFleet("gw", { model: "Qwen/Qwen3-8B" });
  ({ sim, simUrl } = fleet);
});

afterAll(() => fleet.close());

describe("sessions and the OpenAI chat route", () => {
  it("assigns sessions to the least-loaded rank and sends every call of a session to its rank", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 2 }]);
    const a = await openSession(app);
    const b = await openSession(app);
    const sa = (await app.inject({ url: `/v1/sessions/${a.id}` })).json() as Session;
    const sb = (await app.inject({ url: `/v1/sessions/${b.id}` })).json() as Session;
    expect(new Set([sa.assignment!.dp_rank, sb.assignment!.dp_rank])).toEqual(new Set([0, 1]));
    expect(sa.assignment!.served_model).toBe("Qwen/Qwen3-8B");

    const before = getSimState(sim)!.ranks;
    const servedBefore = JSON.stringify(before);
    for (let i = 0; i < 2; i++) {
      const res = await chat(app, a, { model: "agent-name", messages: [{ role: "user", content: `q${i}` }] });
      expect(res.statusCode).toBe(200);
      // The agent's model name comes back; the engine got the served one (it 404s on others).
      expect(res.json().model).toBe("agent-name");
      expect(res.json()).not.toHaveProperty("prompt_token_ids");
    }
    expect(JSON.stringify(getSimState(sim)!.ranks)).not.toBe(servedBefore);
    const { completions } = (await app.inject({ url: `/v1/sessions/${a.id}/completions` })).json() as { completions: CompletionRecord[] };
    expect(completions.map((c) => c.dp_rank)).toEqual([sa.assignment!.dp_rank, sa.assignment!.dp_rank]);
    expect(completions[0]!.output_ids.length).toBe(completions[0]!.output_logprobs.length);
    expect(completions[0]!.prompt_ids.length).toBeGreaterThan(0);
    await app.close();
  });

  it("closes a session and answers its trajectory in the same request when asked, as the trajectory route builds it", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 1 }]);
    const s = await openSession(app);
    expect((await chat(app, s, { messages: [{ role: "user", content: "hi" }] })).statusCode).toBe(200);
    const closed = await app.inject({ method: "POST", url: `/v1/sessions/${s.id}/close?trajectory=per_request` });
    expect(closed.statusCode).toBe(200);
    const body = closed.json() as Session & { trajectory?: unknown; trajectory_error?: unknown };
    expect(body).toMatchObject({ id: s.id, state: "closed", counts: { llm_calls: 1 } });
    expect(body.trajectory_error).toBeUndefined();
    const alone = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory?builder=per_request` })).json() as unknown;
    expect(body.trajectory).toEqual(alone);
    // Closing again answers the closed session as it is; without the query, no trajectory.
    const again = (await app.inject({ method: "POST", url: `/v1/sessions/${s.id}/close` })).json() as Session & { trajectory?: unknown };
    expect(again).toMatchObject({ state: "closed", closed_at: body.closed_at });
    expect(again).not.toHaveProperty("trajectory");
    expect((await app.inject({ method: "POST", url: "/v1/sessions/s-none/close?trajectory=prefix_merging" })).statusCode).toBe(404);
    expect((await app.inject({ method: "POST", url: `/v1/sessions/${s.id}/close?trajectory=nonsense` })).statusCode).toBe(400);
    await app.close();
  });

  it("shows logprobs to a client that asks, and pins the session's sampling", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 2 }]);
    const s = await openSession(app, { sampling: { temperature: 1, max_tokens: 3 } });
    const res = await chat(app, s, {
      messages: [{ role: "user", content: "count" }],
      temperature: 0,
      max_tokens: 50,
      logprobs: true,
      top_logprobs: 2,
    });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.choices[0].finish_reason).toBe("length");
    expect(body.choices[0].logprobs.content).toHaveLength(3);
    expect(body.choices[0].logprobs.content[0].top_logprobs).toHaveLength(2);
    const { completions } = (await app.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: CompletionRecord[] };
    expect(completions[0]!.request.sampling).toEqual({ temperature: 1, max_tokens: 3 });
    expect(completions[0]!.output_ids).toHaveLength(3);
    await app.close();
  });

  it("enforces max_llm_calls and refuses calls on a closed session, in OpenAI's error shape", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 2 }]);
    const s = await openSession(app, { limits: { max_llm_calls: 1 } });
    const msg = { messages: [{ role: "user", content: "hi" }] };
    expect((await chat(app, s, msg)).statusCode).toBe(200);
    const over = await chat(app, s, msg);
    expect(over.statusCode).toBe(400);
    expect(over.json().error).toMatchObject({ type: "invalid_request_error", code: "session_call_limit" });

    const t = await openSession(app);
    expect((await app.inject({ method: "POST", url: `/v1/sessions/${t.id}/close` })).json().state).toBe("closed");
    const closed = await chat(app, t, msg);
    expect(closed.statusCode).toBe(403);
    expect(closed.json().error).toMatchObject({ type: "permission_error", code: "session_closed" });
    await app.close();
  });

  it("numbers a session's calls without gaps when a later call takes its number with the session read; a wrong token or a malformed body takes none", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 2 }]);
    const s = await openSession(app, { limits: { max_llm_calls: 3 } });
    const msg = { messages: [{ role: "user", content: "hi" }] };
    expect((await chat(app, s, msg)).statusCode).toBe(200);
    expect((await chat(app, s, msg, "not-the-token")).statusCode).toBe(401);
    expect((await chat(app, s, { ...msg, temperature: "warm" })).statusCode).toBe(400);
    expect((await chat(app, s, msg)).statusCode).toBe(200);
    expect((await chat(app, s, msg)).statusCode).toBe(200);
    expect((await chat(app, s, msg)).json().error).toMatchObject({ code: "session_call_limit" });
    const { completions } = (await app.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: { seq: number }[] };
    expect(completions.map((c) => c.seq)).toEqual([0, 1, 2]);
    await app.close();
  });

  it("answers malformed agent bodies with 400 naming the field, and records nothing", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 2 }]);
    const s = await openSession(app);
    const badJson = await chat(app, s, "{nope");
    expect(badJson.statusCode).toBe(400);
    expect(badJson.json().error.type).toBe("invalid_request_error");
    const badField = await chat(app, s, { messages: [{ role: "user", content: "x" }], temperature: "warm" });
    expect(badField.statusCode).toBe(400);
    expect(badField.json().error).toMatchObject({ param: "temperature", type: "invalid_request_error" });
    const { completions } = (await app.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: unknown[] };
    expect(completions).toEqual([]);
    await app.close();
  });

  it("fails clearly with 502 when the engine is unreachable", async () => {
    const app = await gateway([{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1 }]);
    const s = await openSession(app);
    const res = await chat(app, s, { messages: [{ role: "user", content: "hi" }] });
    expect(res.statusCode).toBe(502);
    expect(res.json().error.type).toBe("api_error");
    expect(res.json().error.message).toMatch(/engine/);
    await app.close();
  });

  it("notes a failed engine call in the trajectory's stats (it has no tokens to train on)", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 2 }]);
    const s = await openSession(app);
    const rank = ((await app.inject({ url: `/v1/sessions/${s.id}` })).json() as Session).assignment!.dp_rank;
    expect((await chat(app, s, { messages: [{ role: "user", content: "ok" }] })).statusCode).toBe(200);
    getSimState(sim).setFault({ rank, mode: "error", error_rate: 1 });
    let failedStatus = 0;
    try {
      const failed = await chat(app, s, { messages: [{ role: "user", content: "boom" }] });
      failedStatus = failed.statusCode;
      expect(failed.statusCode).toBeGreaterThanOrEqual(500);
      expect(failed.json().error.type).toBe("api_error");
    } finally {
      getSimState(sim).setFault({ rank, mode: "none" });
    }
    const traj = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory` })).json();
    expect(traj.stats.records).toBe(1);
    expect(traj.stats.failed_calls).toEqual([{ seq: 1, at: expect.any(String), kind: "rejected", message: expect.stringMatching(/engine/), dp_rank: rank }]);
    // The call was lost to infrastructure: the trajectory says so, in every format, so a trainer reading it alone never takes it for a whole rollout.
    expect(traj.stats.lost_calls).toMatchObject({ count: 1, first: { status: failedStatus } });
    const verl = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory?format=verl` })).json();
    expect(verl.lost_calls).toEqual(traj.stats.lost_calls);
    // A call after the failure, then the close answers the same trajectory (records and notes read in the close's own step).
    expect((await chat(app, s, { messages: [{ role: "user", content: "again" }] })).statusCode).toBe(200);
    const closed = (await app.inject({ method: "POST", url: `/v1/sessions/${s.id}/close?trajectory=per_request` })).json() as { trajectory: { stats: { records: number } } };
    expect(closed.trajectory.stats.records).toBe(2);
    expect(closed.trajectory).toEqual((await app.inject({ url: `/v1/sessions/${s.id}/trajectory?builder=per_request` })).json());
    await app.close();
  });

  it("serves both trajectory builders and rejects an unknown one", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 2 }]);
    const s = await openSession(app);
    const first = await chat(app, s, { messages: [{ role: "user", content: "hi" }] });
    const answer = first.json().choices[0].message;
    await chat(app, s, { messages: [{ role: "user", content: "hi" }, answer, { role: "user", content: "more" }] });
    const per = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory?builder=per_request` })).json();
    expect(per.traces).toHaveLength(2);
    const merged = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory` })).json();
    expect(merged.builder).toBe("prefix_merging");
    expect(merged.traces).toHaveLength(1);
    const bad = await app.inject({ url: `/v1/sessions/${s.id}/trajectory?builder=magic` });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error.type).toBe("invalid_request");
    expect((await app.inject({ url: `/v1/sessions/s-missing/trajectory` })).statusCode).toBe(404);
    await app.close();
  });

  it("serves prefix_tree: the session's conversations as one tree of shared prefixes, and flat for a trainer's format", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 2 }]);
    const s = await openSession(app);
    const first = await chat(app, s, { messages: [{ role: "user", content: "hi" }] });
    const answer = first.json().choices[0].message;
    await chat(app, s, { messages: [{ role: "user", content: "hi" }, answer, { role: "user", content: "more" }] });
    // A second conversation in the same session: the template's opening tokens are shared with the first.
    await chat(app, s, { messages: [{ role: "user", content: "something else entirely" }] });
    const res = await app.inject({ url: `/v1/sessions/${s.id}/trajectory?builder=prefix_tree` });
    expect(res.statusCode).toBe(200);
    const t = res.json();
    const merged = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory?builder=prefix_merging` })).json();
    expect(t.builder).toBe("prefix_tree");
    expect(t.traces).toEqual(merged.traces);
    expect(t.traces).toHaveLength(2);
    expect(t.traces.map((x: { kind: string }) => x.kind)).toEqual(["main", "main"]);
    const { nodes, samples, tree_tokens, flat_tokens } = t.tree;
    expect(samples).toHaveLength(2);
    expect(nodes.filter((n: { parent: number | null }) => n.parent === null)).toHaveLength(1);
    expect(tree_tokens).toBeLessThan(flat_tokens);
    for (const { node, trace } of samples as { node: number; trace: number }[]) {
      const path: number[] = [];
      for (let k: number | null = node; k !== null; k = nodes[k].parent) path.unshift(...nodes[k].token_ids);
      expect(path).toEqual([...t.traces[trace].prompt_ids, ...t.traces[trace].response_ids]);
    }
    const verl = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory?builder=prefix_tree&format=verl` })).json();
    expect(verl).toMatchObject({ builder: "prefix_tree", format: "verl" });
    expect(verl.samples).toEqual((await app.inject({ url: `/v1/sessions/${s.id}/trajectory?format=verl` })).json().samples);
    await app.close();
  });

  it("requires the API key on trainer routes when one is configured", async () => {
    const app = await gateway([{ kind: "vllm", url: simUrl, dp_size: 1 }], { ROLLGATE_API_KEY: "k-1" });
    expect((await app.inject({ method: "POST", url: "/v1/sessions", payload: {} })).statusCode).toBe(401);
    const ok = await app.inject({ method: "POST", url: "/v1/sessions", payload: {}, headers: { authorization: "Bearer k-1" } });
    expect(ok.statusCode).toBe(201);
    expect((await app.inject({ url: "/healthz" })).json()).toEqual({ status: "ok" });
    await app.close();
  });
});

describe("client disconnects", () => {
  it("cancel the engine request: a streamed call the agent abandons stops generating at once", async () => {
    const slow = buildEngineSim({ dpSize: 1, tpotMs: 50 });
    await slow.listen({ port: 0, host: "127.0.0.1" });
    const addr = slow.server.address();
    const slowUrl = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
    const app = await gateway([{ kind: "vllm", url: slowUrl, dp_size: 1 }]);
    await app.listen({ port: 0, host: "127.0.0.1" });
    const gaddr = app.server.address();
    const base = `http://127.0.0.1:${typeof gaddr === "object" && gaddr ? gaddr.port : 0}`;
    try {
      const s = await openSession(app);
      const abort = new AbortController();
      const res = await fetch(`${base}/s/${s.id}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
        body: JSON.stringify({ stream: true, messages: [{ role: "user", content: '#sim: [{"text": "a", "tokens": 400}]' }] }),
        signal: abort.signal,
      });
      const reader = res.body!.getReader();
      await reader.read(); // the stream has started: the engine is generating
      const engine = getSimState(slow).engine;
      expect(engine.active.size).toBe(1);
      abort.abort();
      const t0 = Date.now();
      while (engine.active.size > 0 && Date.now() - t0 < 5_000) await new Promise((r) => setTimeout(r, 20));
      expect(engine.active.size).toBe(0);
      // 400 tokens at 50 ms would take 20 s: it stopped because the client left.
      expect(Date.now() - t0).toBeLessThan(5_000);
    } finally {
      await app.close();
      await slow.close();
    }
  });
});
