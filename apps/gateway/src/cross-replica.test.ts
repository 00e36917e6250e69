/**
 * Two gateway replicas on one Redis serve the same sessions, each with its own per-process caches
 * (the session parse, record heads, record bases, the continuation plan's shortcuts). Whatever one
 * replica remembers, a session changed through the other (calls answered and stored there, closed,
 * moved to another rank, deleted and opened again under its id) must be served as Redis holds it:
 * a cache that answers from what it remembers gives the trainer a fake trajectory. The replicas are
 * two gateways (Fastify inject) under one key prefix, on one engine-sim of two ranks (real Qwen3
 * tokenizer and template); a replica "restarted" is a third gateway with fresh caches. (In one
 * process the gateways share the module-level tables: agent-common.ts `known`, the continuation
 * planner's; the store's caches, `keptChat` and the pending writes are each replica's own.)
 */
import { randomUUID } from "node:crypto";
import Anthropic from "@anthropic-ai/sdk";
import type { ClosedSession, CompletionRecord, Session, Trajectory } from "@rollgate/protocol";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminReplica } from "./__fixtures__/admin-replica.js";
import { dropPrefixes, listenLocal, startSimFleet, type SimFleet } from "./__fixtures__/harness.js";
import { RankHealthBus } from "./ops/rank-health.js";

const prefix = `test-xreplica-${randomUUID().slice(0, 8)}`;
const WAIT_MS = 400;
let fleet: SimFleet;
let A: FastifyInstance;
let B: FastifyInstance;
const extra: FastifyInstance[] = [];

const replica = () =>
  fleet.gateway({ env: { ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_HEALTH_INTERVAL_S: "0", ROLLGATE_CONTINUATION: "auto", ROLLGATE_APPEND_WAIT_MS: String(WAIT_MS) } });

beforeAll(async () => {
  fleet = await startSimFleet("xreplica", { dpSize: 2, model: "Qwen/Qwen3-8B" });
  A = await replica();
  B = await replica();
});
afterAll(async () => {
  for (const app of [A, B, ...extra]) await app?.close();
  await fleet?.close();
  await dropPrefixes([prefix]);
});

type Opened = { id: string; token: string };

async function open(via: FastifyInstance, body: Record<string, unknown> = {}): Promise<Opened> {
  const res = await via.inject({ method: "POST", url: "/v1/sessions", payload: body });
  expect(res.statusCode, res.body).toBe(201);
  return res.json() as Opened;
}

function chat(via: FastifyInstance, s: Opened, payload: Record<string, unknown>) {
  return via.inject({ method: "POST", url: `/s/${s.id}/v1/chat/completions`, headers: { authorization: `Bearer ${s.token}` }, payload });
}

const records = async (via: FastifyInstance, id: string) => ((await via.inject({ url: `/v1/sessions/${id}/completions` })).json() as { completions: CompletionRecord[] }).completions;
const trajectory = async (via: FastifyInstance, id: string, builder = "") =>
  (await via.inject({ url: `/v1/sessions/${id}/trajectory${builder ? `?builder=${builder}` : ""}` })).json() as Trajectory;
const session = async (via: FastifyInstance, id: string) => (await via.inject({ url: `/v1/sessions/${id}` })).json() as Session;
const closeVia = async (via: FastifyInstance, id: string) => {
  const res = await via.inject({ method: "POST", url: `/v1/sessions/${id}/close?trajectory=per_request` });
  expect(res.statusCode, res.body).toBe(200);
  return res.json() as ClosedSession;
};

const TOOLS = [
  { type: "function", function: { name: "shell", description: "Run a shell command", parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] } } },
  { type: "function", function: { name: "read", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } } } } },
];
const call = (name: string, args: Record<string, unknown>) => ({ name, arguments: args });

/** A tool conversation over two user turns: reasoning (when on), text beside calls, two calls in one answer. */
function scripts(thinking: boolean) {
  const think = (t: string) => (thinking ? { think: t } : {});
  return [
    [
      { ...think("First I look around."), tool_calls: [call("shell", { command: "ls -la" })] },
      { ...think("Two files to read."), text: "Reading both.", tool_calls: [call("read", { path: "a.txt" }), call("read", { path: "b.txt" })] },
      { ...think("Done."), text: "Both files are short." },
    ],
    [
      { ...think("Count them."), tool_calls: [call("shell", { command: "wc -l a.txt b.txt" })] },
      { ...think("Report."), text: "Three lines in all." },
    ],
  ];
}

/**
 * An OpenAI-chat agent (as continuation.test.ts drives engine-sim): each call goes to
 * `via(call index)`, echoing its history its own way (reasoning dropped when `dropReasoning`,
 * as OpenAI-SDK agents do); tool results name the call.
 */
async function runAgent(
  via: (i: number) => FastifyInstance,
  s: Opened,
  thinking: boolean,
  dropReasoning: boolean,
  { system = "You are a careful agent.", turn: before }: { system?: string; turn?: (i: number) => Promise<void> } = {},
) {
  const messages: Record<string, unknown>[] = [{ role: "system", content: system }];
  let i = 0;
  for (const [turn, script] of scripts(thinking).entries()) {
    messages.push({ role: "user", content: `Task part ${turn + 1}.\n#sim: ${JSON.stringify(script)}` });
    for (let step = 0; step < script.length; step++) {
      await before?.(i);
      const res = await chat(via(i++), s, { model: "agent", messages, tools: TOOLS, chat_template_kwargs: { enable_thinking: thinking } });
      expect(res.statusCode, res.body).toBe(200);
      const answer = res.json().choices[0].message as { content: string | null; reasoning?: string | null; tool_calls?: { id: string; function: { name: string; arguments: string } }[] };
      const echo: Record<string, unknown> = { role: "assistant", content: answer.content ?? null };
      if (!dropReasoning && answer.reasoning) echo.reasoning = answer.reasoning;
      if (answer.tool_calls?.length) echo.tool_calls = answer.tool_calls.map((t) => ({ id: t.id, type: "function", function: t.function }));
      messages.push(echo);
      for (const t of answer.tool_calls ?? []) messages.push({ role: "tool", tool_call_id: t.id, content: `result of ${t.function.name} ${t.function.arguments}` });
    }
  }
  return i;
}

/** What must not depend on which replica served a call: every token, logprob and answer. */
const tokensOf = (rs: CompletionRecord[]) =>
  rs.map((r) => ({
    seq: r.seq,
    prompt_ids: r.prompt_ids,
    output_ids: r.output_ids,
    output_logprobs: r.output_logprobs,
    finish_reason: r.finish_reason,
    content: r.message.content,
    reasoning: r.message.reasoning,
    tools: r.message.tool_calls.map((t) => t.function),
  }));
const traceOf = (t: Trajectory) => ({ breaks: t.stats.breaks, traces: t.traces.map((x) => ({ prompt_ids: x.prompt_ids, response_ids: x.response_ids, loss_mask: x.loss_mask, response_logprobs: x.response_logprobs })) });

describe("one session's calls alternating between two replicas (ROLLGATE_CONTINUATION=auto)", () => {
  // Thinking off: Qwen3's template drops the empty think block of earlier turns, so each call
  // continues the previous one token-in from a record the other replica wrote. Thinking on with
  // reasoning dropped by the agent: each echoed turn is restored from the other replica's record.
  for (const [thinking, dropReasoning] of [
    [false, false],
    [true, true],
  ] as const) {
    it(`thinking ${thinking ? "on, reasoning not echoed" : "off"}: records and trajectory equal those of one replica, read through either, and through a restarted one`, async () => {
      const alone = await open(A);
      const n = await runAgent(() => A, alone, thinking, dropReasoning);
      // Each call is sent as soon as the other replica answered: its record may still be on its
      // way, or stored between this call's reads (a race: run a few times to meet it).
      const splits = [await open(A), await open(B), await open(A)];
      for (const s of splits) expect(await runAgent((i) => (i % 2 === 0 ? A : B), s, thinking, dropReasoning)).toBe(n);
      const split = splits[0]!;

      const expected = await records(A, alone.id);
      expect(expected).toHaveLength(n);
      const want = traceOf(await trajectory(A, alone.id));
      expect(want.traces).toHaveLength(1);
      for (const via of [A, B]) {
        for (const s of splits) expect(tokensOf(await records(via, s.id))).toEqual(tokensOf(expected));
        expect(traceOf(await trajectory(via, split.id))).toEqual(want);
      }
      // A replica with none of it cached (restarted): records stored as deltas of records it never saw.
      const fresh = await replica();
      extra.push(fresh);
      expect(tokensOf(await records(fresh, split.id))).toEqual(tokensOf(expected));
      expect(traceOf(await trajectory(fresh, split.id))).toEqual(want);
      const closed = await closeVia(fresh, split.id);
      expect(closed.lost_calls.count).toBe(0);
      expect(traceOf(closed.trajectory!)).toEqual(traceOf(await trajectory(A, alone.id, "per_request")));
    }, 30_000);
  }
});

/**
 * An Anthropic-SDK agent, streamed, thinking on: each call to `urls[call index % urls.length]`; it
 * echoes each answer's content blocks as given (thinking blocks with the signature the replica that
 * answered gave them).
 */
async function runAnthropicAgent(urls: string[], s: Opened) {
  const script = [
    { think: "List first.", text: "Listing.", tool_calls: [call("bash", { command: "ls" })] },
    { think: "Read both.", tool_calls: [call("bash", { command: "cat a.txt" }), call("bash", { command: "cat b.txt" })] },
    { think: "Count.", tool_calls: [call("bash", { command: "wc -l a.txt" })] },
    { think: "And the other.", text: "One more.", tool_calls: [call("bash", { command: "wc -l b.txt" })] },
    { think: "Enough.", text: "All read." },
  ];
  const tools: Anthropic.Tool[] = [{ name: "bash", description: "Run a command", input_schema: { type: "object", properties: { command: { type: "string" } } } }];
  const messages: Anthropic.MessageParam[] = [{ role: "user", content: `Read the files.\n#sim: ${JSON.stringify(script)}` }];
  for (let i = 0; i < script.length; i++) {
    const client = new Anthropic({ apiKey: s.token, baseURL: `${urls[i % urls.length]}/s/${s.id}`, maxRetries: 0 });
    const m = await client.messages.stream({ model: "m", max_tokens: 256, tools, thinking: { type: "enabled", budget_tokens: 128 }, messages }).finalMessage();
    messages.push({ role: "assistant", content: m.content });
    const uses = m.content.filter((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
    if (uses.length === 0) break;
    messages.push({ role: "user", content: uses.map((u) => ({ type: "tool_result" as const, tool_use_id: u.id, content: `ran ${JSON.stringify(u.input)}` })) });
  }
  return messages;
}

describe("an agent and its sub-agent in one session, on both replicas", () => {
  const MAIN = "You are the main agent.";
  const SUB = "You are a sub-agent.";
  /** Per conversation (by its system prompt): its records' tokens, in call order. */
  const byConversation = (rs: CompletionRecord[]) => [MAIN, SUB].map((sys) => tokensOf(rs.filter((r) => r.request.messages[0]!.content === sys)).map(({ seq: _seq, ...t }) => t));
  const traces = (t: Trajectory) => traceOf(t).traces.sort((x, y) => (JSON.stringify(x.prompt_ids) < JSON.stringify(y.prompt_ids) ? -1 : 1));

  /** Both conversations one after the other through A: what each must give however they are served. */
  async function alone() {
    const s = await open(A);
    await runAgent(() => A, s, false, false, { system: MAIN });
    await runAgent(() => A, s, false, false, { system: SUB });
    const t = await trajectory(A, s.id);
    expect(t.traces).toHaveLength(2);
    return { records: byConversation(await records(A, s.id)), traces: traces(t) };
  }

  // Both scripts answer the same words at the same place (a text turn without tool calls): the
  // turn the agent echoes must be restored from its own conversation's record, not the other's.
  it("in lock step (each call after the other conversation's), calls alternating replicas: each conversation equals itself alone", async () => {
    const want = await alone();
    const s = await open(B);
    // Conversation k's call i is sent once the lock step reaches 2i + k; each answer advances it.
    let at = 0;
    const waiters: (() => void)[] = [];
    const advance = () => {
      at++;
      for (const w of waiters.splice(0)) w();
    };
    const run = (k: number, system: string) =>
      runAgent((i) => ((i + k) % 2 === 0 ? A : B), s, false, false, {
        system,
        turn: async (i) => {
          if (i > 0) advance();
          while (at !== 2 * i + k) await new Promise<void>((r) => waiters.push(r));
        },
      }).then(advance);
    await Promise.all([run(0, MAIN), run(1, SUB)]);
    expect(byConversation(await records(A, s.id))).toEqual(want.records);
    expect(traces(await trajectory(B, s.id))).toEqual(want.traces);
  });

  it("concurrently, calls alternating replicas: each conversation equals itself alone", async () => {
    const want = await alone();
    const s = await open(B);
    await Promise.all([runAgent((i) => (i % 2 === 0 ? A : B), s, false, false, { system: MAIN }), runAgent((i) => (i % 2 === 0 ? B : A), s, false, false, { system: SUB })]);
    expect(byConversation(await records(A, s.id))).toEqual(want.records);
    expect(traces(await trajectory(B, s.id))).toEqual(want.traces);
  });
});

describe("an Anthropic agent streaming, its calls alternating between replicas", () => {
  // Each replica serves every other call: its heads read before (cached) lack the other's records.
  it("thinking blocks signed by one replica are taken back by the other; records and trajectory equal one replica's", async () => {
    const a = await listenLocal(A);
    const b = await listenLocal(B);
    const alone = await open(A);
    const want = await runAnthropicAgent([a], alone);
    const split = await open(B);
    expect(await runAnthropicAgent([b, a], split)).toHaveLength(want.length);
    const expected = await records(A, alone.id);
    expect(expected).toHaveLength(5);
    expect(expected[1]!.request.messages[1]).toMatchObject({ role: "assistant", reasoning: expect.stringContaining("List first.") });
    expect(tokensOf(await records(B, split.id))).toEqual(tokensOf(expected));
    const trace = traceOf(await trajectory(A, alone.id));
    expect(trace.traces).toHaveLength(1);
    expect(traceOf(await trajectory(B, split.id))).toEqual(trace);
  });
});

const sim = (text: string) => `go\n#sim: ${JSON.stringify([{ text }])}`;
/** The engine's answer has whitespace around it; an agent echoes it trimmed. A turn restored from a record shows the whitespace again. */
const GENERATED = "\n\nthe answer  ";

describe("a session changed through the other replica", () => {
  it("closed through B while A has it cached: A refuses the next call (403 session_closed) and records nothing", async () => {
    const s = await open(A);
    expect((await chat(A, s, { messages: [{ role: "user", content: sim("one") }] })).statusCode).toBe(200);
    expect((await chat(A, s, { messages: [{ role: "user", content: sim("one") }, { role: "assistant", content: "one" }, { role: "user", content: sim("two") }] })).statusCode).toBe(200);
    const closed = await closeVia(B, s.id);
    expect(closed.counts.llm_calls).toBe(2);
    const res = await chat(A, s, { messages: [{ role: "user", content: sim("one") }, { role: "assistant", content: "one" }, { role: "user", content: sim("three") }] });
    expect(res.statusCode).toBe(403);
    expect(res.json().error.code ?? res.json().error.type).toMatch(/session_closed/);
    await new Promise((r) => setTimeout(r, 50));
    expect((await records(B, s.id)).map((r) => r.seq)).toEqual([0, 1]);
    expect((await session(A, s.id)).counts.llm_calls).toBe(2);
  });

  it("moved to another rank through B while A has its assignment cached: A's next call goes to the new rank", async () => {
    const bus = await adminReplica(prefix);
    const health = new RankHealthBus(bus.admin, bus.channel);
    const heard: string[] = [];
    health.onChange((member, down) => heard.push(`${member} ${down ? "down" : "up"}`));
    await health.start();
    // Told to every replica at once (one publish): once this listener heard it, so did the gateways' (a margin for their event loop).
    const announce = async (member: string, down: boolean) => {
      await health.announce(member, down);
      await expect.poll(() => heard.at(-1)).toBe(`${member} ${down ? "down" : "up"}`);
      await new Promise((r) => setTimeout(r, 30));
    };
    try {
      const s = await open(A);
      const first = (await session(A, s.id)).assignment!;
      const from = `0:${first.dp_rank}`;
      expect((await chat(A, s, { messages: [{ role: "user", content: sim("one") }] })).statusCode).toBe(200);
      // Its rank goes down: B's call moves it (both replicas hear it), then the rank comes back.
      await announce(from, true);
      expect((await chat(B, s, { messages: [{ role: "user", content: sim("two") }] })).statusCode).toBe(200);
      await announce(from, false);
      const moved = (await session(B, s.id)).assignment!;
      expect(moved.dp_rank).not.toBe(first.dp_rank);
      // A last read the session on its old rank, which is up again: the call must still go where the session is.
      expect((await chat(A, s, { messages: [{ role: "user", content: sim("three") }] })).statusCode).toBe(200);
      const rs = await records(A, s.id);
      expect(rs.map((r) => [r.seq, r.dp_rank, r.rerouted_from?.dp_rank ?? null])).toEqual([
        [0, first.dp_rank, null],
        [1, moved.dp_rank, first.dp_rank],
        [2, moved.dp_rank, null],
      ]);
      await closeVia(B, s.id);
    } finally {
      await bus.close();
    }
  });

  it("deleted through B and opened again under its id while A remembers it: an old token takes nothing from the new session, and A restores no turn from the old records", async () => {
    const id = `s-remade-${randomUUID().slice(0, 8)}`;
    const old = await open(A, { id });
    const OLD = "\n\nold answer  ";
    // Two calls through A: A now knows the token, the parse, the record heads (call 0's) and bases of the old session.
    const first = { role: "user", content: sim(OLD) };
    expect((await chat(A, old, { messages: [first] })).statusCode).toBe(200);
    expect((await chat(A, old, { messages: [first, { role: "assistant", content: "old answer" }, { role: "user", content: sim(OLD) }] })).statusCode).toBe(200);
    expect((await records(A, id)).map((r) => r.request.messages[1]?.content ?? null)).toEqual([null, OLD]);

    expect((await B.inject({ method: "DELETE", url: `/v1/sessions/${id}` })).statusCode).toBe(204);
    const remade = await open(B, { id });
    // The old rollout's agent is still running: its token is refused, and must not use up a call of the new one.
    expect((await chat(A, old, { messages: [first] })).statusCode).toBe(401);
    // The new rollout: its first call through B (as many records as A knows heads of), its second
    // through A, echoing the new answer and (as agents may) a turn with the old session's answer.
    const user = { role: "user", content: sim(GENERATED) };
    expect((await chat(B, remade, { messages: [user] })).statusCode).toBe(200);
    const echoed = [user, { role: "assistant", content: "the answer" }, { role: "user", content: sim(OLD) }, { role: "assistant", content: "old answer" }, { role: "user", content: sim("next") }];
    expect((await chat(A, remade, { messages: echoed })).statusCode).toBe(200);
    const closed = await closeVia(B, id);
    expect(closed.lost_calls.count).toBe(0);
    const rs = await records(A, id);
    expect(rs.map((r) => r.seq)).toEqual([0, 1]);
    // Its own answer restored as generated; the old session's answer left as the agent sent it.
    expect(rs[1]!.request.messages[1]).toMatchObject({ role: "assistant", content: GENERATED });
    expect(rs[1]!.request.messages[3]).toMatchObject({ role: "assistant", content: "old answer" });
  });

  it("deleted and opened again under its id as a branch while A remembers the plain session: an old token does not shift the replayed calls", async () => {
    const src = await open(A);
    const user = { role: "user", content: sim(GENERATED) };
    expect((await chat(A, src, { messages: [user] })).statusCode).toBe(200);
    const id = `s-rebranch-${randomUUID().slice(0, 8)}`;
    const old = await open(A, { id });
    expect((await chat(A, old, { messages: [user] })).statusCode).toBe(200);
    expect((await B.inject({ method: "DELETE", url: `/v1/sessions/${id}` })).statusCode).toBe(204);
    const branch = await open(B, { id, replay: { session_id: src.id, calls: 1 } });
    expect((await chat(A, old, { messages: [user] })).statusCode).toBe(401);
    // The branch's call 0 is answered by the source's call 0, through either replica.
    const res = await chat(A, branch, { messages: [user] });
    expect(res.statusCode, res.body).toBe(200);
    expect((await chat(B, branch, { messages: [user, { role: "assistant", content: "the answer" }, { role: "user", content: sim("own") }] })).statusCode).toBe(200);
    const rs = await records(A, id);
    expect(rs.map((r) => [r.seq, r.replayed_from ?? null])).toEqual([
      [0, (await records(A, src.id))[0]!.id],
      [1, null],
    ]);
    expect((await session(A, id)).replay_diverged).toBeNull();
    expect((await closeVia(A, id)).lost_calls.count).toBe(0);
  });
});

describe("a branch session whose calls alternate between replicas", () => {
  it("replays the source's first calls by index on either replica, then samples: the same records as through one replica", async () => {
    const src = await open(A);
    const n = await runAgent(() => A, src, true, false);
    const source = await records(A, src.id);
    const at = 3;
    const alone = await open(A, { replay: { session_id: src.id, calls: at } });
    expect(await runAgent(() => A, alone, true, false)).toBe(n);
    const split = await open(B, { replay: { session_id: src.id, calls: at } });
    expect(await runAgent((i) => (i % 2 === 0 ? B : A), split, true, false)).toBe(n);
    const got = await records(B, split.id);
    expect(got.map((r) => r.replayed_from ?? null)).toEqual(source.map((r, i) => (i < at ? r.id : null)));
    expect(tokensOf(got)).toEqual(tokensOf(await records(A, alone.id)));
    expect(traceOf(await trajectory(A, split.id))).toEqual(traceOf(await trajectory(A, alone.id)));
    expect((await session(A, split.id)).replay_diverged).toBeNull();
  }, 20_000);
});
