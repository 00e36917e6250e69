/**
 * An abort-mode pause while agents are mid-call, through the OpenAI SDK against engine-sim with
 * real Redis, on engines that cannot freeze calls in place (a vLLM older than `/pause?mode=keep`)
 * serving a model whose profile declares a gateway parser (qwen3): the engine cuts the calls, and
 * after resume the gateway continues them token-in from their tokens (/v1/completions with token
 * ids), so each agent gets the same answer an uncut call gives (reasoning, tool calls and all) and
 * the record keeps every token's weight version; on SGLang through /generate with input_ids.
 * pause-freeze.test.ts covers the freeze-in-place pauses (vLLM keep, SGLang in_place) on every
 * model family.
 */
import type { CompletionRecord } from "@rollgate/protocol";
import { getTokenizer } from "@rollgate/engine-sim";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHarness, type Harness } from "./__fixtures__/harness.js";

const tok = getTokenizer();
const TOOLS: OpenAI.ChatCompletionTool[] = [{ type: "function", function: { name: "ls", parameters: { type: "object" } } }];
const step = { think: "look around first", text: "checking", tool_calls: [{ name: "ls", arguments: { path: "." } }], tokens: 50 };
const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `list it\n#sim: ${JSON.stringify([step])}` }];

async function admin(h: Harness, path: string, body: unknown = {}) {
  const res = await fetch(`${h.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return (await res.json()) as Record<string, unknown>;
}

/** Pauses (abort) once the call has generated some tokens, sets `version`, resumes. */
async function pauseMidCall(h: Harness, version: string, afterMs = 300) {
  await new Promise((r) => setTimeout(r, afterMs));
  const paused = await admin(h, "/admin/inference/pause", { mode: "abort", timeout_s: 5 });
  await admin(h, "/admin/weights", { version });
  await admin(h, "/admin/inference/resume");
  return paused;
}

const sdk = (h: Harness, s: { id: string; token: string }) => new OpenAI({ baseURL: `${h.url}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });

/** The last vLLM release without `/pause?mode=keep`. */
const NO_KEEP = "0.15.1";

describe("abort-mode pause on vLLM: calls continue token-in", () => {
  let h: Harness;
  let reference: { message: OpenAI.ChatCompletionMessage; record: CompletionRecord };
  beforeAll(async () => {
    h = await startHarness("pause-abort", { tpotMs: 20, vllmVersion: NO_KEEP });
    await admin(h, "/admin/weights", { version: "w1" });
    const s = await h.openSession();
    const res = await sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS });
    reference = { message: res.choices[0]!.message, record: (await h.records(s.id))[0]! };
  });
  afterAll(async () => h?.close());

  const sameAnswer = (got: OpenAI.ChatCompletionMessage) => {
    const m = got as OpenAI.ChatCompletionMessage & { reasoning?: string | null };
    const ref = reference.message as typeof m;
    expect(m.content).toBe(ref.content);
    expect(m.reasoning).toBe(ref.reasoning);
    expect(m.reasoning).toContain("look around first");
    expect(m.tool_calls?.map((c) => c.type === "function" && c.function)).toEqual(ref.tool_calls?.map((c) => c.type === "function" && c.function));
  };

  it("non-streamed: one answer with reasoning and tool call, tokens split across weight versions", async () => {
    await admin(h, "/admin/weights", { version: "w1" });
    const s = await h.openSession();
    const call = sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS });
    const paused = await pauseMidCall(h, "w2");
    expect(paused).toMatchObject({ mode: "abort", inflight_at_pause: 1, drained: true });
    const res = await call;
    expect(res.choices[0]!.finish_reason).toBe("tool_calls");
    sameAnswer(res.choices[0]!.message);
    expect(res.usage).toMatchObject({ prompt_tokens: reference.record.prompt_ids.length, completion_tokens: 50 });

    const [rec] = await h.records(s.id);
    expect(rec!.output_ids).toEqual(reference.record.output_ids);
    expect(rec!.prompt_ids).toEqual(reference.record.prompt_ids);
    expect(rec).toMatchObject({ weight_version: "w2", continued_after_pause: 1, finish_reason: "tool_calls" });
    const v = rec!.output_weight_versions!;
    const cutAt = v.indexOf("w2");
    expect(cutAt).toBeGreaterThan(0);
    expect(v).toEqual([...Array(cutAt).fill("w1"), ...Array(50 - cutAt).fill("w2")]);
    expect(rec!.output_logprobs.every((x) => Number.isFinite(x) && x <= 0)).toBe(true);
    // The engine's weights did not change (only the version's name did): each token's logprob is the uncut call's, the cut's side included.
    expect(rec!.output_logprobs).toEqual(reference.record.output_logprobs);
    const metrics = await (await fetch(`${h.url}/metrics`)).text();
    expect(metrics).toMatch(/rollgate_pause_cuts_total\{engine="0",dp_rank="0"\} [1-9]/);
  });

  // Cut inside the reasoning (~4 tokens in) and after it, in the answer text.
  it.each([80, 300])("streamed, cut after %i ms: the agent's stream goes on after resume; one finish; the assembled message is the uncut one", async (afterMs) => {
    await admin(h, "/admin/weights", { version: "w1" });
    const s = await h.openSession();
    const finishes: string[] = [];
    // The SDK's assembler keeps only the last piece of fields it does not know (reasoning): join them here.
    let reasoning = "";
    const stream = sdk(h, s).chat.completions.stream({ model: "m", messages, tools: TOOLS, stream_options: { include_usage: true } });
    stream.on("chunk", (c) => {
      if (c.choices[0]?.finish_reason) finishes.push(c.choices[0].finish_reason);
      reasoning += (c.choices[0]?.delta as { reasoning?: string } | undefined)?.reasoning ?? "";
    });
    await pauseMidCall(h, "w2", afterMs);
    const final = await stream.finalChatCompletion();
    expect(finishes).toEqual(["tool_calls"]);
    sameAnswer({ ...final.choices[0]!.message, reasoning } as OpenAI.ChatCompletionMessage);
    expect(final.usage).toMatchObject({ completion_tokens: 50 });
    const [rec] = await h.records(s.id);
    expect(rec!.output_ids).toEqual(reference.record.output_ids);
    expect(rec!.output_logprobs).toEqual(reference.record.output_logprobs);
    expect(new Set(rec!.output_weight_versions)).toEqual(new Set(["w1", "w2"]));
  });

  it("two pauses in one call: three weight versions in order", async () => {
    await admin(h, "/admin/weights", { version: "w1" });
    const s = await h.openSession();
    const call = sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS });
    await pauseMidCall(h, "w2", 250);
    await pauseMidCall(h, "w3", 250);
    sameAnswer((await call).choices[0]!.message);
    const [rec] = await h.records(s.id);
    expect(rec!.continued_after_pause).toBe(2);
    const runs = rec!.output_weight_versions!.filter((v, i, a) => i === 0 || a[i - 1] !== v);
    expect(runs).toEqual(["w1", "w2", "w3"]);
  });

  it("max_tokens counts the whole answer: the continuation only gets what is left", async () => {
    const s = await h.openSession();
    const call = sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS, max_tokens: 30 });
    await pauseMidCall(h, "w2");
    const res = await call;
    expect(res.choices[0]!.finish_reason).toBe("length");
    expect(res.usage?.completion_tokens).toBe(30);
    const [rec] = await h.records(s.id);
    expect(rec!.output_ids).toEqual(reference.record.output_ids.slice(0, 30));
    expect(tok.decode(rec!.output_ids)).toContain("look around first");
  });

  it("streamed, max_tokens: one stream that ends on length at the whole answer's budget", async () => {
    const s = await h.openSession();
    const finishes: string[] = [];
    const stream = sdk(h, s).chat.completions.stream({ model: "m", messages, tools: TOOLS, max_tokens: 30, stream_options: { include_usage: true } });
    stream.on("chunk", (c) => {
      if (c.choices[0]?.finish_reason) finishes.push(c.choices[0].finish_reason);
    });
    await pauseMidCall(h, "w2");
    const final = await stream.finalChatCompletion();
    expect(finishes).toEqual(["length"]);
    expect(final.usage?.completion_tokens).toBe(30);
    const [rec] = await h.records(s.id);
    expect(rec!.output_ids).toEqual(reference.record.output_ids.slice(0, 30));
    expect(rec!.continued_after_pause).toBe(1);
  });

  it("a multi-turn call sent to the chat route while its continuation plan is made: cut and continued like any call", async () => {
    const second = { think: "one file there", text: "There is one file.", tokens: 50 };
    const opening: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `list it\n#sim: ${JSON.stringify([{ think: step.think, tool_calls: step.tool_calls }, second])}` }];
    /** The session's second call (its history reproduces: it goes to the chat route), cut by a pause when `cut`. */
    const secondCall = async (cut: boolean) => {
      await admin(h, "/admin/weights", { version: "w1" });
      const s = await h.openSession();
      const first = await sdk(h, s).chat.completions.create({ model: "m", messages: opening, tools: TOOLS });
      const m = first.choices[0]!.message;
      const history: OpenAI.ChatCompletionMessageParam[] = [
        ...opening,
        { role: "assistant", content: m.content, tool_calls: m.tool_calls },
        { role: "tool", tool_call_id: m.tool_calls![0]!.id, content: "a.txt" },
      ];
      const call = sdk(h, s).chat.completions.create({ model: "m", messages: history, tools: TOOLS });
      if (cut) await pauseMidCall(h, "w2");
      const res = await call;
      return { message: res.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning?: string }, records: await h.records(s.id) };
    };
    // The first session teaches the gateway that this engine's histories reproduce; the second and
    // third sessions' second calls go to the engine before their plans are made.
    await secondCall(false);
    const uncut = await secondCall(false);
    const got = await secondCall(true);
    expect(got.message.content).toContain("There is one file.");
    expect({ content: got.message.content, reasoning: got.message.reasoning }).toEqual({ content: uncut.message.content, reasoning: uncut.message.reasoning });
    expect(got.records).toHaveLength(2);
    const [rec, ref] = [got.records[1]!, uncut.records[1]!];
    expect(rec).toMatchObject({ continued_after_pause: 1, weight_version: "w2", finish_reason: "stop" });
    expect(rec.prompt_ids).toEqual(ref.prompt_ids);
    expect(rec.output_ids).toEqual(ref.output_ids);
    expect(new Set(rec.output_weight_versions)).toEqual(new Set(["w1", "w2"]));
  });
});

// Cut (a vLLM without `/pause?mode=keep`) or frozen in place (one with it, engine-sim's default release).
describe.each([
  ["cut", NO_KEEP],
  ["frozen", undefined],
])("abort-mode pause (the early call %s) while a call sent early to the chat route waits for its plan, which turns token-in", (_how, vllmVersion) => {
  let h: Harness;
  // A slow /tokenize (300 ms a render): the pause lands while the plan is still being made.
  beforeAll(async () => {
    h = await startHarness("pause-abort-plan", { tpotMs: 20, tokenizeMs: 300, ...(vllmVersion ? { vllmVersion } : {}) });
  });
  afterAll(async () => h?.close());

  const first = { think: "look around first", tool_calls: [{ name: "ls", arguments: { path: "." } }] };
  const scripts = [[first, { think: "one file there", text: "There is one file." }], [{ think: "say more", text: "Here is more about it.", tokens: 40 }]];
  type Message = OpenAI.ChatCompletionMessage & { reasoning?: string | null };
  /**
   * A thinking-on session over two user queries; its third call (after the second query: Qwen3
   * drops the first query's reasoning, so the plan turns token-in) is sent while `during` runs.
   */
  async function session(during: () => Promise<unknown>, stream: boolean) {
    await admin(h, "/admin/weights", { version: "w1" });
    const s = await h.openSession();
    const extra = { chat_template_kwargs: { enable_thinking: true } } as Record<string, unknown>;
    const messages: OpenAI.ChatCompletionMessageParam[] = [];
    const ask = async () => {
      if (!stream) return (await sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS, ...extra })).choices[0]!.message as Message;
      let reasoning = "";
      const st = sdk(h, s).chat.completions.stream({ model: "m", messages, tools: TOOLS, ...extra });
      st.on("chunk", (c) => (reasoning += (c.choices[0]?.delta as { reasoning?: string } | undefined)?.reasoning ?? ""));
      return { ...(await st.finalChatCompletion()).choices[0]!.message, reasoning } as Message;
    };
    const echo = (m: Message) => messages.push({ role: "assistant", content: m.content, reasoning: m.reasoning, ...(m.tool_calls?.length ? { tool_calls: m.tool_calls } : {}) } as OpenAI.ChatCompletionAssistantMessageParam);
    messages.push({ role: "user", content: `list it\n#sim: ${JSON.stringify(scripts[0])}` });
    const m1 = await ask();
    echo(m1);
    messages.push({ role: "tool", tool_call_id: m1.tool_calls![0]!.id, content: "a.txt" });
    echo(await ask());
    messages.push({ role: "user", content: `and then?\n#sim: ${JSON.stringify(scripts[1])}` });
    const closed = async () => ((await h.sim.inject({ url: "/sim/stats" })).json() as { ranks: { client_closed: number }[] }).ranks[0]!.client_closed;
    const before = await closed();
    const [third, side] = await Promise.all([ask(), during()]);
    const closedEarly = (await closed()) - before;
    const records = await h.records(s.id);
    const stats = (await (await fetch(`${h.url}/v1/sessions/${s.id}/trajectory`)).json()) as { stats: { failed_calls?: unknown[] } };
    return { third, side, closedEarly, records, failed: stats.stats.failed_calls ?? [] };
  }

  it.each([false, true])("streamed %s: the early call is dropped; after resume the token-in call answers, on the new weights, recorded once", async (stream) => {
    const uncut = await session(async () => null, stream);
    // Uncut, the early engine call is closed by the gateway once its plan turns token-in.
    expect(uncut.closedEarly).toBe(1);
    // Paused as soon as the call holds its slot: its plan (two 300 ms renders) is not known yet.
    const got = await session(async () => {
      // (The in-flight count Redis holds is reported within 20 ms: the previous call's is gone by then.)
      await new Promise((r) => setTimeout(r, 60));
      while (((await (await fetch(`${h.url}/admin/inference`)).json()) as { inflight: number }).inflight < 1) await new Promise((r) => setTimeout(r, 5));
      return pauseMidCall(h, "w2", 0);
    }, stream);
    expect(got.side).toMatchObject({ mode: "abort", inflight_at_pause: 1, drained: true });
    expect({ content: got.third.content, reasoning: got.third.reasoning }).toEqual({ content: uncut.third.content, reasoning: uncut.third.reasoning });
    expect(got.third.content).toContain("Here is more about it.");
    expect(got.records).toHaveLength(3);
    const [rec, ref] = [got.records[2]!, uncut.records[2]!];
    // The token-in call's prompt keeps the first query's reasoning the model saw.
    expect(tok.decode(rec.prompt_ids)).toContain("look around first");
    expect(rec.prompt_ids).toEqual(ref.prompt_ids);
    expect(rec.output_ids).toEqual(ref.output_ids);
    expect(rec).toMatchObject({ weight_version: "w2", finish_reason: "stop" });
    expect(rec.continued_after_pause).toBeUndefined();
    expect(rec.output_weight_versions).toBeUndefined();
    expect(got.failed).toEqual([]);
  });
});

describe("abort-mode pause when the call's rank goes down during the pause", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness("pause-abort-down", { tpotMs: 20, dpSize: 2, vllmVersion: NO_KEEP }, { ROLLGATE_HEALTH_INTERVAL_S: "0.2", ROLLGATE_HEALTH_FAILURES: "1" });
  });
  afterAll(async () => h?.close());

  const fault = (rank: number, mode: "down" | "none") =>
    fetch(`http://127.0.0.1:${(h.sim.server.address() as { port: number }).port}/sim/faults`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rank, mode }),
    });

  const rankOf = async (sid: string) => ((await (await fetch(`${h.url}/v1/sessions/${sid}`)).json()) as { assignment: { dp_rank: number } }).assignment.dp_rank;

  /** Pauses once the call has some tokens, takes its rank down during the pause, resumes, runs `then`; the rank comes back after. */
  async function rankDownDuringPause(rank: number, then: () => Promise<void>) {
    await new Promise((r) => setTimeout(r, 300));
    await admin(h, "/admin/inference/pause", { mode: "abort", timeout_s: 5 });
    // The engine restarts badly during the weight update: its rank is down when inference resumes.
    await fault(rank, "down");
    try {
      // No probe runs while paused (engine-health.test.ts), so the failure is found by the continuation itself.
      await admin(h, "/admin/weights", { version: "d2" });
      await admin(h, "/admin/inference/resume");
      await then();
    } finally {
      await fault(rank, "none");
    }
  }

  /** The record of a cut call that moved off `rank`: the whole answer, on the other rank, over both weight versions. */
  async function expectMoved(sid: string, rank: number) {
    const [rec] = await h.records(sid);
    expect(rec).toMatchObject({ dp_rank: 1 - rank, rerouted_from: { engine: 0, dp_rank: rank }, continued_after_pause: 1, weight_version: "d2" });
    expect(rec!.output_ids).toHaveLength(50);
    expect(new Set(rec!.output_weight_versions)).toEqual(new Set(["d1", "d2"]));
    expect(await rankOf(sid)).toBe(1 - rank);
  }

  it("after resume the cut call moves off the rank that failed it, and the record says so", async () => {
    await admin(h, "/admin/weights", { version: "d1" });
    const s = await h.openSession();
    const rank = await rankOf(s.id);
    const call = sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS });
    await rankDownDuringPause(rank, async () => {
      const res = await call;
      expect(res.choices[0]!.finish_reason).toBe("tool_calls");
      expect(res.choices[0]!.message.tool_calls).toHaveLength(1);
      await expectMoved(s.id, rank);
    });
  });

  it("streamed: the cut stream goes on from the other rank, with one finish", async () => {
    await admin(h, "/admin/weights", { version: "d1" });
    // The rank the last test took down may still be drained here: wait until both take sessions again.
    await expect.poll(async () => ((await (await fetch(`${h.url}/readyz`)).json()) as { engines?: { healthy_ranks: number }[] }).engines?.[0]?.healthy_ranks, { timeout: 10_000 }).toBe(2);
    const s = await h.openSession();
    const rank = await rankOf(s.id);
    const finishes: string[] = [];
    const stream = sdk(h, s).chat.completions.stream({ model: "m", messages, tools: TOOLS });
    stream.on("chunk", (c) => {
      if (c.choices[0]?.finish_reason) finishes.push(c.choices[0].finish_reason);
    });
    await rankDownDuringPause(rank, async () => {
      const final = await stream.finalChatCompletion();
      expect(finishes).toEqual(["tool_calls"]);
      expect(final.choices[0]!.message.tool_calls).toHaveLength(1);
      await expectMoved(s.id, rank);
    });
  });
});

describe("abort-mode pause on SGLang: calls continue through /generate with input_ids", () => {
  let h: Harness;
  let reference: CompletionRecord;
  beforeAll(async () => {
    // Without SGLang parser names the gateway cannot read /generate with SGLang's parse routes, so it
    // cannot follow an in-place pause: the qwen3 gateway parser continues cut calls instead.
    const noEngineParsers = { extends: "qwen3", engine_parsers: { sglang: { tool_call_parser: null, reasoning_parser: null } } };
    h = await startHarness("pause-abort-sgl", { kind: "sglang", tpotMs: 20 }, {}, undefined, noEngineParsers);
    const s = await h.openSession();
    await sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS });
    reference = (await h.records(s.id))[0]!;
  });
  afterAll(async () => h?.close());

  it("non-streamed: one whole answer, the tokens split across weight versions", async () => {
    await admin(h, "/admin/weights", { version: "s1" });
    const s = await h.openSession();
    const call = sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS });
    const paused = await pauseMidCall(h, "s2");
    expect(paused).toMatchObject({ engines: [expect.objectContaining({ plan: "abort_continue", mode: "abort", ok: true })] });
    const res = await call;
    expect(res.choices[0]!.finish_reason).toBe("tool_calls");
    expect(res.choices[0]!.message.tool_calls?.map((c) => c.type === "function" && c.function)).toEqual([{ name: "ls", arguments: '{"path": "."}' }]);
    const [rec] = await h.records(s.id);
    expect(rec).toMatchObject({ weight_version: "s2", continued_after_pause: 1 });
    expect(rec!.output_ids).toEqual(reference.output_ids);
    expect(rec!.output_logprobs).toEqual(reference.output_logprobs);
    expect(rec!.message).toEqual({ ...reference.message, tool_calls: [{ ...reference.message.tool_calls[0]!, id: rec!.message.tool_calls[0]!.id }] });
    expect(new Set(rec!.output_weight_versions)).toEqual(new Set(["s1", "s2"]));
  });

  it("streamed: the stream goes on after resume with one finish", async () => {
    await admin(h, "/admin/weights", { version: "s1" });
    const s = await h.openSession();
    const finishes: string[] = [];
    const stream = sdk(h, s).chat.completions.stream({ model: "m", messages, tools: TOOLS });
    stream.on("chunk", (c) => {
      if (c.choices[0]?.finish_reason) finishes.push(c.choices[0].finish_reason);
    });
    await pauseMidCall(h, "s2");
    const final = await stream.finalChatCompletion();
    expect(finishes).toEqual(["tool_calls"]);
    expect(final.choices[0]!.message.content).toBe(reference.message.content);
    const [rec] = await h.records(s.id);
    expect(rec!.output_ids).toEqual(reference.output_ids);
    expect(rec!.output_logprobs).toEqual(reference.output_logprobs);
    expect(rec!.continued_after_pause).toBe(1);
  });
});
