/**
 * A multi-turn call is sent to the engine's chat route before its continuation plan is made, when
 * its session's (for its first, its engine's) last plan kept the chat route (chat-call.ts
 * `planning`): the engine's prompt, from its first chunk, decides it when it continues the
 * record; otherwise the plan's renders are made while the engine works. The gateway runs
 * in-process (Fastify inject) against an engine-sim on a real port (real Qwen3 tokenizer and
 * template, scripted by `#sim:`, a 150 ms first token so an engine call is still running when its
 * plan is known) on the real Redis. The sim's /sim/stats counts requests whose client went away.
 */
import { randomUUID } from "node:crypto";
import type { CompletionRecord, Trajectory } from "@rollgate/protocol";
import { buildEngineSim, getTokenizer } from "@rollgate/engine-sim";
import type { FastifyInstance } from "fastify";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { dropPrefixes, listenLocal, TEST_REDIS_URL } from "./__fixtures__/harness.js";
import { buildGateway } from "./app.js";
import { fromSse, type AssistantAnswer } from "./__fixtures__/openai-sse.js";
import { GatewayEnv } from "./env.js";
import { startHarness } from "./__fixtures__/harness.js";

const prefixes: string[] = [];
const apps: FastifyInstance[] = [];
let sim: FastifyInstance;
let simUrl: string;

async function gateway(mode: "auto" | "render" | "token_in"): Promise<FastifyInstance> {
  const prefix = `test-spec-${randomUUID().slice(0, 8)}`;
  prefixes.push(prefix);
  const env = GatewayEnv.parse({
    REDIS_URL: TEST_REDIS_URL,
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: simUrl, dp_size: 1, profile: "qwen3" }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0",
    ROLLGATE_CONTINUATION: mode,
  });
  const app = await buildGateway({ env, logger: pino({ level: "silent" }) });
  apps.push(app);
  return app;
}

beforeAll(async () => {
  // The engine must still be generating when a plan turns token-in (an early call is counted closed
  // only if it is left before its end): a TTFT well above what a plan takes on a loaded machine.
  sim = buildEngineSim({ dpSize: 1, model: "Qwen/Qwen3-8B", ttftMs: 400 });
  simUrl = await listenLocal(sim);
});

afterAll(async () => {
  for (const app of apps) await app.close();
  await sim.close();
  await dropPrefixes(prefixes);
});

async function simStats(): Promise<{ closed: number; tokenized: number }> {
  const stats = (await (await fetch(`${simUrl}/sim/stats`)).json()) as { tokenize_requests: number; ranks: { client_closed: number }[] };
  return { closed: stats.ranks[0]!.client_closed, tokenized: stats.tokenize_requests };
}

/** Requests the sim admitted whose client went away (the gateways' own probes of the engine are never closed early). */
async function simClosed(): Promise<number> {
  return (await simStats()).closed;
}

const TOOLS = [{ type: "function", function: { name: "shell", description: "Run a shell command", parameters: { type: "object", properties: { command: { type: "string" } } } } }];

interface Step {
  think: string;
  text?: string;
  tool_calls?: { name: string; arguments: Record<string, unknown> }[];
}

/**
 * A thinking-on agent that echoes its reasoning back: one script per user query. Returns how many
 * engine requests were closed early during each call and how many renders (`/tokenize`) each call
 * asked of the engine, with the session's answers, records and trajectory.
 */
async function runAgent(app: FastifyInstance, scripts: Step[][], stream: boolean) {
  const s = (await app.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
  const messages: Record<string, unknown>[] = [{ role: "system", content: "You are a careful agent." }];
  const answers: AssistantAnswer[] = [];
  const closedPerCall: number[] = [];
  const rendersPerCall: number[] = [];
  for (let turn = 0; turn < scripts.length; turn++) {
    messages.push({ role: "user", content: `Task part ${turn + 1}.\n#sim: ${JSON.stringify(scripts[turn])}` });
    for (;;) {
      const before = await simStats();
      const res = await app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}` },
        payload: { model: "agent", messages, tools: TOOLS, stream, chat_template_kwargs: { enable_thinking: true } },
      });
      expect(res.statusCode, res.body).toBe(200);
      const after = await simStats();
      closedPerCall.push(after.closed - before.closed);
      rendersPerCall.push(after.tokenized - before.tokenized);
      const answer = stream ? fromSse(res.body) : (res.json().choices[0].message as AssistantAnswer);
      answers.push({ content: answer.content ?? null, reasoning: answer.reasoning ?? null, tool_calls: answer.tool_calls ?? [] });
      messages.push({
        role: "assistant",
        content: answer.content ?? null,
        reasoning: answer.reasoning,
        ...(answer.tool_calls?.length ? { tool_calls: answer.tool_calls.map((t) => ({ id: t.id, type: "function", function: t.function })) } : {}),
      });
      if (!answer.tool_calls?.length) break;
      for (const t of answer.tool_calls) messages.push({ role: "tool", tool_call_id: t.id, content: `result of ${t.function.arguments}` });
    }
  }
  const records = ((await app.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: CompletionRecord[] }).completions;
  const trajectory = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory` })).json() as Trajectory;
  return { answers, records, trajectory, closedPerCall, rendersPerCall };
}

/** What a record says of the call, without its ids, timings and the engine's prefix-cache hits (the sim's cache is shared by every run). */
const strip = (r: CompletionRecord) => ({
  seq: r.seq,
  prompt_ids: r.prompt_ids,
  output_ids: r.output_ids,
  output_logprobs: r.output_logprobs,
  finish_reason: r.finish_reason,
  usage: { prompt_tokens: r.usage.prompt_tokens, completion_tokens: r.usage.completion_tokens },
  message: { ...r.message, tool_calls: r.message.tool_calls.map((t) => t.function) },
  request: r.request.messages.map((m) => (m.role === "assistant" ? { ...m, tool_calls: m.tool_calls?.map((t) => t.function) } : m.role === "tool" ? m.content : m)),
});
const shown = (a: AssistantAnswer) => ({ content: a.content, reasoning: a.reasoning, tool_calls: a.tool_calls.map((t) => t.function) });

const tool = (think: string): Step => ({ think, tool_calls: [{ name: "shell", arguments: { command: "ls" } }] });
/** One user query: the echoed history reproduces (Qwen3 keeps the reasoning of the current query's turns). */
const oneQuery: Step[][] = [[tool("Look first."), { think: "Enough.", text: "There is one file." }]];
/** Three user queries: from the second on, Qwen3 drops earlier reasoning, and the call continues token-in. */
const threeQueries: Step[][] = [[tool("Look first."), { think: "Enough.", text: "There is one file." }], [{ think: "More.", text: "Here is more." }], [{ think: "Last.", text: "Done." }]];

describe("a multi-turn call sent to the chat route while its plan is made", () => {
  it("answers and records as without the overlap; a token-in plan aborts the engine call and records the token-in call; the next call of a token-in engine key is not sent early", async () => {
    const auto = await gateway("auto");
    // The engine key's first plan is not overlapped; it finds the history reproduced.
    const learn = await runAgent(auto, oneQuery, false);
    expect(learn.closedPerCall).toEqual([0, 0]);
    expect(learn.rendersPerCall[1]).toBeGreaterThan(0);
    // The history normaliser learns, once per shape of echoed turn, how the template re-renders it
    // (renders of its own): the turn restored in its learned form is a shape of its own, learned here.
    await runAgent(auto, oneQuery, false);
    // Now the chat route is taken early, and kept: the same answers and records as a gateway that
    // always lets the engine render, and no engine call closed early. The engine's own prompt, from
    // its answer's first chunk, continues the recorded tokens: no render is asked of it.
    const render = await gateway("render");
    for (const stream of [false, true]) {
      const [overlapped, rendered] = [await runAgent(auto, oneQuery, stream), await runAgent(render, oneQuery, stream)];
      expect(overlapped.closedPerCall).toEqual([0, 0]);
      expect(overlapped.rendersPerCall).toEqual([0, 0]);
      expect(overlapped.answers.map(shown)).toEqual(rendered.answers.map(shown));
      expect(overlapped.records.map(strip)).toEqual(rendered.records.map(strip));
      expect(overlapped.trajectory.traces).toHaveLength(1);
    }

    // Three user queries: the call after the second query is sent early (the last plan kept the
    // chat route), its plan continues token-in: the early engine call is closed, and the token-in
    // call is the one answered and recorded. The call after the third is not sent early (the last
    // plan was token-in). Records as a gateway that continues every call token-in (never early).
    const tokenIn = await gateway("token_in");
    for (const stream of [false, true]) {
      const early = await runAgent(auto, threeQueries, stream);
      const plain = await runAgent(tokenIn, threeQueries, stream);
      expect(early.closedPerCall).toEqual([0, 0, 1, 0]);
      expect(plain.closedPerCall).toEqual([0, 0, 0, 0]);
      // The early call's prompt drops the reasoning the record holds: its plan was made (renders).
      expect(early.rendersPerCall[2]).toBeGreaterThan(0);
      expect(early.answers.map(shown)).toEqual(plain.answers.map(shown));
      expect(early.records.map(strip)).toEqual(plain.records.map(strip));
      expect(early.trajectory.traces).toHaveLength(1);
      expect(early.trajectory.stats.failed_calls ?? []).toEqual([]);
      // The recorded call is the token-in one: its prompt keeps the reasoning the model saw.
      expect(getTokenizer().decode(early.records[2]!.prompt_ids)).toContain("<think>\nEnough.\n</think>\n\nThere is one file.<|im_end|>\n<|im_start|>user\nTask part 2.");
    }
  });
});

/** An agent run one call at a time (`step`), so two sessions' calls can be interleaved on one gateway. */
function stepper(app: FastifyInstance, scripts: Step[][]) {
  let s: { id: string; token: string } | null = null;
  const messages: Record<string, unknown>[] = [{ role: "system", content: "You are a careful agent." }];
  let turn = 0;
  let asked = false;
  const closedPerCall: number[] = [];
  return {
    closedPerCall,
    /** One call; false once the last query is answered. */
    async step(): Promise<boolean> {
      s ??= (await app.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
      if (!asked) {
        messages.push({ role: "user", content: `Task part ${turn + 1}.\n#sim: ${JSON.stringify(scripts[turn])}` });
        asked = true;
      }
      const before = await simClosed();
      const res = await app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}` },
        payload: { model: "agent", messages, tools: TOOLS, chat_template_kwargs: { enable_thinking: true } },
      });
      expect(res.statusCode, res.body).toBe(200);
      closedPerCall.push((await simClosed()) - before);
      const answer = res.json().choices[0].message as AssistantAnswer;
      messages.push({ role: "assistant", content: answer.content ?? null, reasoning: answer.reasoning, ...(answer.tool_calls?.length ? { tool_calls: answer.tool_calls.map((t) => ({ id: t.id, type: "function", function: t.function })) } : {}) });
      if (answer.tool_calls?.length) {
        for (const t of answer.tool_calls) messages.push({ role: "tool", tool_call_id: t.id, content: `result of ${t.function.arguments}` });
        return true;
      }
      asked = false;
      return ++turn < scripts.length;
    },
  };
}

describe("two sessions of one engine key, their calls interleaved", () => {
  it("a session whose last plan continued token-in is not sent to the chat route early, whatever another session's last plan was", async () => {
    const auto = await gateway("auto");
    // A: three user queries (token-in from the second on); B: one query, every history reproduces.
    const a = stepper(auto, threeQueries);
    const b = stepper(auto, [[tool("One."), tool("Two."), tool("Three."), { think: "Done.", text: "All read." }]]);
    let more = true;
    while (more) {
      more = await a.step();
      if (more) await b.step();
    }
    // A's call after the second query is sent early (its own last plan kept the chat route) and
    // aborted; its call after the third is not sent early, though B's plan just before kept the chat route.
    expect(a.closedPerCall).toEqual([0, 0, 1, 0]);
    expect(b.closedPerCall.every((n) => n === 0)).toBe(true);
  });
});

describe("an agent that leaves while its call's plan is being made", () => {
  it("the early engine call is closed, nothing is recorded or noted for it, and the session's next call goes on", async () => {
    // A slow /tokenize (300 ms a render): the agent leaves while the plan is still pending.
    const h = await startHarness("spec-leave", { tpotMs: 20, tokenizeMs: 300 });
    try {
      const s = await h.openSession();
      const stats = async () => (await h.sim.inject({ url: "/sim/stats" })).json() as { tokenize_requests: number; ranks: { client_closed: number }[] };
      const closed = async () => (await stats()).ranks[0]!.client_closed;
      const post = (messages: Record<string, unknown>[], signal?: AbortSignal) =>
        fetch(`${h.url}/s/${s.id}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${s.token}` },
          body: JSON.stringify({ model: "m", messages, tools: TOOLS, chat_template_kwargs: { enable_thinking: true } }),
          ...(signal ? { signal } : {}),
        });
      const script = [tool("Look first."), tool("Again."), { think: "Enough.", text: "There is one file.", tokens: 40 }];
      const messages: Record<string, unknown>[] = [{ role: "user", content: `Task.\n#sim: ${JSON.stringify(script)}` }];
      const echo = async (res: Response) => {
        expect(res.status).toBe(200);
        const m = ((await res.json()) as { choices: { message: AssistantAnswer }[] }).choices[0]!.message;
        messages.push({ role: "assistant", content: m.content, reasoning: m.reasoning, tool_calls: m.tool_calls });
        messages.push({ role: "tool", tool_call_id: m.tool_calls[0]!.id, content: "a.txt" });
      };
      await echo(await post(messages));
      // The second call's plan keeps the chat route: the session's third call is sent early. It
      // asks a new query, so the template drops the reasoning the record holds: the engine's prompt
      // does not continue the record, and the plan's renders (300 ms each) are made.
      await echo(await post(messages));
      messages.push({ role: "user", content: "Go on." });
      const before = await closed();
      const rendersBefore = (await stats()).tokenize_requests;
      const leave = new AbortController();
      const left = post(messages, leave.signal).catch((err: Error) => err);
      // Left once the call holds its slot (its engine call sent): its plan (300 ms renders) is not known yet.
      await new Promise((r) => setTimeout(r, 60));
      while (((await (await fetch(`${h.url}/admin/inference`)).json()) as { inflight: number }).inflight < 1) await new Promise((r) => setTimeout(r, 5));
      await new Promise((r) => setTimeout(r, 30));
      leave.abort();
      expect(await left).toBeInstanceOf(Error);
      // It left while the plan's renders were being made.
      expect((await stats()).tokenize_requests).toBeGreaterThan(rendersBefore);
      // The agent asks again: answered, not held behind the call it left.
      const again = await post(messages, AbortSignal.timeout(10_000));
      expect(again.status).toBe(200);
      expect(((await again.json()) as { choices: { message: AssistantAnswer }[] }).choices[0]!.message.content).toContain("There is one file.");
      expect((await closed()) - before).toBeGreaterThanOrEqual(1);
      const records = await h.records(s.id);
      expect(records.map((r) => r.seq)).toEqual([0, 1, 3]);
      const trajectory = (await (await fetch(`${h.url}/v1/sessions/${s.id}/trajectory`)).json()) as Trajectory;
      expect(trajectory.stats.failed_calls ?? []).toEqual([]);
    } finally {
      await h.close();
    }
  });
});
