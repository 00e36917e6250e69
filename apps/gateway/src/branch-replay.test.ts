/**
 * Replay-then-branch at the gateway (docs/data-model.md#branches), with the official SDKs against
 * engine-sim and real Redis: a session opened with `replay` gets its first calls answered from the
 * source session's records (the same answer, tool call ids included, streamed or not, in the
 * agent's protocol), the rest from the engine; a request that differs from the recorded one is
 * refused as `replay_diverged` and the session says where; the trajectory masks replayed answers
 * unless the branch trains them; a branch goes to its source's rank.
 */
import Anthropic from "@anthropic-ai/sdk";
import type { CompletionRecord, Session, Trajectory } from "@rollgate/protocol";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { keys } from "@rollgate/store";
import { Redis } from "ioredis";
import { TEST_REDIS_URL, startHarness, type Harness } from "./__fixtures__/harness.js";

const TOOLS: OpenAI.ChatCompletionTool[] = [{ type: "function", function: { name: "shell", parameters: { type: "object", properties: { command: { type: "string" } } } } }];
const steps = [
  { think: "start", tool_calls: [{ name: "shell", arguments: { command: "echo one > a.txt" } }] },
  { tool_calls: [{ name: "shell", arguments: { command: "echo two >> a.txt" } }] },
  { tool_calls: [{ name: "shell", arguments: { command: "echo three >> a.txt" } }] },
  { text: "done" },
];

type Opened = { id: string; token: string };
const sdk = (h: Harness, s: Opened) => new OpenAI({ baseURL: `${h.url}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });

async function open(h: Harness, body: Record<string, unknown> = {}): Promise<Opened & { status: number }> {
  const res = await fetch(`${h.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, ...((await res.json()) as Opened) };
}

const session = async (h: Harness, id: string) => (await (await fetch(`${h.url}/v1/sessions/${id}`)).json()) as Session;

/**
 * An agent that runs the script: each tool call's result is `toolResult(call index)`. Returns every
 * answer it got (the OpenAI SDK's parsed response, minus the per-response id and time).
 */
async function runAgent(h: Harness, s: Opened, user: string, toolResult: (i: number) => string = (i) => `ok ${i}`) {
  const client = sdk(h, s);
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: user }];
  const answers: unknown[] = [];
  for (let i = 0; i < 8; i++) {
    const res = await client.chat.completions.create({ model: "m", messages, tools: TOOLS });
    const { id: _id, created: _created, ...rest } = res;
    answers.push(rest);
    const msg = res.choices[0]!.message;
    messages.push(msg);
    if (!msg.tool_calls?.length) break;
    for (const c of msg.tool_calls) messages.push({ role: "tool", tool_call_id: c.id, content: toolResult(i) });
  }
  return answers;
}

describe("replaying a recorded rollout", () => {
  let h: Harness;
  let source: Opened;
  let sourceAnswers: unknown[];
  let sourceRecords: CompletionRecord[];
  const user = `build a.txt\n#sim: ${JSON.stringify(steps)}`;
  beforeAll(async () => {
    h = await startHarness("branch", { dpSize: 4 });
    source = await open(h);
    sourceAnswers = await runAgent(h, source, user);
    sourceRecords = await h.records(source.id);
    expect(sourceRecords).toHaveLength(4);
  });
  afterAll(async () => h?.close());

  it("answers the first calls from the records, byte for byte, then samples from the engine", async () => {
    const branch = await open(h, { replay: { session_id: source.id, calls: 2 } });
    expect(branch.status).toBe(201);
    const answers = await runAgent(h, branch, user);
    expect(answers).toHaveLength(4);
    // The replayed answers are the source's exactly (content, reasoning, tool call ids, finish, usage).
    expect(answers.slice(0, 2)).toEqual(sourceAnswers.slice(0, 2));
    const records = await h.records(branch.id);
    expect(records.map((r) => r.replayed_from ?? null)).toEqual([sourceRecords[0]!.id, sourceRecords[1]!.id, null, null]);
    expect(records[0]!.output_ids).toEqual(sourceRecords[0]!.output_ids);
    expect(records[0]!.output_logprobs).toEqual(sourceRecords[0]!.output_logprobs);
    // The engine answered calls 2 and 3 (its usage says it saw the prompt).
    expect(records[2]!.usage.prompt_tokens).toBeGreaterThan(0);
    expect((await session(h, branch.id)).assignment!.dp_rank).toBe((await session(h, source.id)).assignment!.dp_rank);

    const t = (await (await fetch(`${h.url}/v1/sessions/${branch.id}/trajectory`)).json()) as Trajectory;
    expect(t.traces).toHaveLength(1);
    const spans = t.stats.per_trace[0]!.spans;
    const mask = t.traces[0]!.loss_mask;
    const outputMask = (k: number) => mask.slice(spans[k]!.output_start, spans[k]!.end);
    // Replayed answers are not samples of this run: masked, logprob 0; the engine's are trained.
    expect(outputMask(0).every((m) => m === 0) && outputMask(1).every((m) => m === 0)).toBe(true);
    expect(outputMask(2).every((m) => m === 1) && outputMask(3).every((m) => m === 1)).toBe(true);
    expect(t.stats.trainable_tokens).toBe(records[2]!.output_ids.length + records[3]!.output_ids.length);
  });

  it("replayed calls are not engine calls in the metrics: the engine's calls, tokens and latency count only what it generated; replays count apart", async () => {
    /** A metric summed over its label sets (only `kind`'s is kept apart). */
    const scrape = async () => {
      const text = await (await fetch(`${h.url}/metrics`)).text();
      const sum = (name: string, kind?: string) =>
        text
          .split("\n")
          .filter((l) => l.startsWith(`${name}{`) && (kind === undefined || l.includes(`kind="${kind}"`)))
          .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
      return {
        calls: sum("rollgate_llm_calls_total"),
        completion: sum("rollgate_llm_tokens_total", "completion"),
        prompt: sum("rollgate_llm_tokens_total", "prompt"),
        latencyCount: sum("rollgate_engine_latency_seconds_count"),
        replayed: sum("rollgate_replayed_calls_total"),
      };
    };
    const before = await scrape();
    const branch = await open(h, { replay: { session_id: source.id, calls: 3 } });
    await runAgent(h, branch, user);
    const records = await h.records(branch.id);
    expect(records.map((r) => r.replayed_from !== undefined)).toEqual([true, true, true, false]);
    const after = await scrape();
    // Only call 3 went to the engine.
    expect(after.calls - before.calls).toBe(1);
    expect(after.completion - before.completion).toBe(records[3]!.usage.completion_tokens);
    expect(after.prompt - before.prompt).toBe(records[3]!.usage.prompt_tokens);
    expect(after.latencyCount - before.latencyCount).toBe(1);
    expect(after.replayed - before.replayed).toBe(3);
  });

  it("a branch sampled otherwise than its source: replayed records keep the sampling their tokens were drawn with, sampled ones have the branch's", async () => {
    const branch = await open(h, { replay: { session_id: source.id, calls: 2 }, sampling: { temperature: 0.3, top_p: 0.9 } });
    await runAgent(h, branch, user);
    const records = await h.records(branch.id);
    expect(records.map((r) => r.request.sampling)).toEqual([
      sourceRecords[0]!.request.sampling,
      sourceRecords[1]!.request.sampling,
      expect.objectContaining({ temperature: 0.3, top_p: 0.9 }),
      expect.objectContaining({ temperature: 0.3, top_p: 0.9 }),
    ]);
    expect(sourceRecords[0]!.request.sampling.temperature).not.toBe(0.3);
  });

  it("with train: true the replayed answers keep their logprobs and stay trainable", async () => {
    const branch = await open(h, { replay: { session_id: source.id, calls: 2, train: true } });
    await runAgent(h, branch, user);
    const t = (await (await fetch(`${h.url}/v1/sessions/${branch.id}/trajectory`)).json()) as Trajectory;
    const spans = t.stats.per_trace[0]!.spans;
    expect(t.traces[0]!.loss_mask.slice(spans[0]!.output_start, spans[0]!.end).every((m) => m === 1)).toBe(true);
    expect(t.traces[0]!.response_logprobs.slice(spans[0]!.output_start, spans[0]!.end)).toEqual(sourceRecords[0]!.output_logprobs);
  });

  it("the trainer formats of a branch: replayed answers are mask 0 with logprob 0, or the source's logprobs with train_replayed; sampled ones the engine's", async () => {
    for (const train of [false, true]) {
      const branch = await open(h, { replay: { session_id: source.id, calls: 2, train } });
      await runAgent(h, branch, user);
      const records = await h.records(branch.id);
      const t = (await (await fetch(`${h.url}/v1/sessions/${branch.id}/trajectory`)).json()) as Trajectory;
      const spans = t.stats.per_trace[0]!.spans;
      const fetchFormat = async (format: string) => ((await (await fetch(`${h.url}/v1/sessions/${branch.id}/trajectory?format=${format}`)).json()) as { samples: Record<string, number[]>[] }).samples;
      const [verl] = await fetchFormat("verl");
      const [slime] = await fetchFormat("slime");
      const [prime] = await fetchFormat("prime-rl");
      for (const k of [0, 1, 2, 3]) {
        // Spans index the response, as the formats' masks and logprobs do.
        const from = spans[k]!.output_start;
        const to = spans[k]!.end;
        const replayed = k < 2;
        const mask = replayed && !train ? 0 : 1;
        const logprobs = replayed && !train ? records[k]!.output_ids.map(() => 0) : (replayed ? sourceRecords[k]! : records[k]!).output_logprobs;
        for (const [m, l] of [
          [verl!.response_mask, verl!.rollout_log_probs],
          [slime!.loss_mask, slime!.rollout_log_probs],
          [prime!.completion_mask, prime!.completion_logprobs],
        ] as const) {
          expect(m!.slice(from, to).every((x) => x === mask)).toBe(true);
          expect(l!.slice(from, to)).toEqual(logprobs);
        }
      }
    }
  });

  it("past the branch point nothing the agent asks makes the branch diverge (an agent cannot get its run unscored at will): a replayed request asked again, or anything else, is sampled", async () => {
    const branch = await open(h, { replay: { session_id: source.id, calls: 1 } });
    const client = sdk(h, branch);
    const first = { model: "m", messages: [{ role: "user" as const, content: user }], tools: TOOLS };
    await client.chat.completions.create(first);
    // Calls 1 to 3: the first request again (its answer was given: not replayed twice), then stranger ones.
    await client.chat.completions.create(first);
    await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "something else entirely" }] });
    await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "and another" }], reasoning_effort: "low" });
    expect((await h.records(branch.id)).map((r) => r.replayed_from ?? null)).toEqual([sourceRecords[0]!.id, null, null, null]);
    expect((await session(h, branch.id)).replay_diverged).toBeNull();
  });

  it("a branch of a source still open over a call still running is refused saying so (it is no failed call: its answer is on its way)", async () => {
    const src = await open(h);
    const client = sdk(h, src);
    const first = { model: "m", messages: [{ role: "user" as const, content: user }], tools: TOOLS };
    await client.chat.completions.create(first);
    const rank = (await session(h, src.id)).assignment!.dp_rank;
    await h.sim.inject({ method: "POST", url: "/sim/faults", payload: { rank, mode: "slow", delay_ms: 3000 } });
    // Ended however the test goes: a slow call left running would hold the harness's close.
    const stop = new AbortController();
    try {
      const running = client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "slow one" }] }, { signal: stop.signal }).catch(() => null);
      // Branched once the gateway has numbered the running call.
      const redis = new Redis(TEST_REDIS_URL, { maxRetriesPerRequest: 1 });
      try {
        while ((await redis.zcard(keys(h.prefix).pendingCalls(src.id))) === 0) await new Promise((r) => setTimeout(r, 20));
      } finally {
        redis.disconnect();
      }
      const res = await fetch(`${h.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ replay: { session_id: src.id, calls: 2 } }) });
      expect(res.status).toBe(409);
      expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/call 1 has not answered yet/);
      stop.abort();
      await running;
    } finally {
      stop.abort();
      await h.sim.inject({ method: "POST", url: "/sim/faults", payload: { mode: "none" } });
    }
    // Once it has ended (here without an answer: a failed call, no record), the branch point is there.
    expect((await open(h, { replay: { session_id: src.id, calls: 2 } })).status).toBe(201);
  });

  it("a streaming agent gets the replayed answer as a stream in its protocol (Anthropic Messages)", async () => {
    const src = await open(h);
    const anthropic = (s: Opened) => new Anthropic({ baseURL: `${h.url}/s/${s.id}`, apiKey: s.token, maxRetries: 0 });
    const ask = { model: "m", max_tokens: 200, messages: [{ role: "user" as const, content: `hi\n#sim: ${JSON.stringify([{ think: "hm", text: "hello there" }])}` }] };
    const original = await anthropic(src).messages.stream(ask).finalMessage();
    const branch = await open(h, { replay: { session_id: src.id, calls: 1 } });
    const replayed = await anthropic(branch).messages.stream(ask).finalMessage();
    // Byte for byte but the thinking block's signature, which is keyed per session (reasoning-seal.ts).
    const unsigned = (blocks: Anthropic.ContentBlock[]) => blocks.map((b) => (b.type === "thinking" ? { ...b, signature: "" } : b));
    expect(unsigned(replayed.content)).toEqual(unsigned(original.content));
    expect(replayed.content[0]).toMatchObject({ type: "thinking", thinking: expect.stringContaining("hm") });
    expect(replayed.stop_reason).toBe(original.stop_reason);
    expect((await h.records(branch.id))[0]!.replayed_from).toBe((await h.records(src.id))[0]!.id);
  });

  it("a replayed Responses answer reports the reasoning tokens its source reported, streamed or not", async () => {
    const body = { model: "m", input: `hi\n#sim: ${JSON.stringify([{ think: "Think it over first.", text: "hello there" }])}` };
    const src = await open(h);
    const original = await sdk(h, src).responses.create(body);
    const reported = original.usage!.output_tokens_details.reasoning_tokens;
    // Some of the answer's tokens are reasoning, not all.
    expect(reported).toBeGreaterThan(0);
    expect(reported).toBeLessThan(original.usage!.output_tokens);
    // The source's record keeps the count: the replay has no token text to count from.
    expect((await h.records(src.id))[0]!.usage.reasoning_tokens).toBe(reported);
    for (const stream of [false, true]) {
      const branch = await open(h, { replay: { session_id: src.id, calls: 1 } });
      let usage: OpenAI.Responses.ResponseUsage | undefined;
      if (stream) {
        for await (const ev of await sdk(h, branch).responses.create({ ...body, stream: true })) if (ev.type === "response.completed") usage = ev.response.usage;
      } else usage = (await sdk(h, branch).responses.create(body)).usage;
      expect(usage).toEqual(original.usage);
      expect((await h.records(branch.id))[0]!.replayed_from).toBe((await h.records(src.id))[0]!.id);
    }
  });

  it("a replayed call's logprobs carry each token's text, as the engine spelled it for the source (chat completions, streamed or not; Responses output_text)", async () => {
    const body = { model: "m", messages: [{ role: "user" as const, content: `hi\n#sim: ${JSON.stringify([{ text: "héllo there, naïve wörld" }])}` }], logprobs: true };
    const src = await open(h);
    const original = (await sdk(h, src).chat.completions.create(body)).choices[0]!.logprobs!.content!;
    expect(original.length).toBeGreaterThan(3);
    expect(original.every((l) => l.token !== "")).toBe(true);
    const without = (ls: { token: string; logprob: number; bytes: number[] | null }[]) => ls.map((l) => ({ token: l.token, logprob: l.logprob, bytes: l.bytes }));
    const branch = await open(h, { replay: { session_id: src.id, calls: 1 } });
    const replayed = (await sdk(h, branch).chat.completions.create(body)).choices[0]!.logprobs!.content!;
    expect(without(replayed)).toEqual(without(original));
    // Streamed: the same tokens, chunk by chunk.
    const streamedBranch = await open(h, { replay: { session_id: src.id, calls: 1 } });
    const streamed: { token: string; logprob: number; bytes: number[] | null }[] = [];
    for await (const chunk of await sdk(h, streamedBranch).chat.completions.create({ ...body, stream: true })) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    expect(without(streamed)).toEqual(without(original));
    // Responses: the output_text's own tokens, found by their text.
    const rbody = { model: "m", input: `hi\n#sim: ${JSON.stringify([{ text: "hello there" }])}`, include: ["message.output_text.logprobs" as const] };
    const rsrc = await open(h);
    const textOf = (r: OpenAI.Responses.Response) => (r.output.find((o) => o.type === "message") as OpenAI.Responses.ResponseOutputMessage).content[0] as OpenAI.Responses.ResponseOutputText;
    const rOriginal = textOf(await sdk(h, rsrc).responses.create(rbody)).logprobs!;
    expect(rOriginal.length).toBeGreaterThan(0);
    const rbranch = await open(h, { replay: { session_id: rsrc.id, calls: 1 } });
    expect(textOf(await sdk(h, rbranch).responses.create(rbody)).logprobs).toEqual(rOriginal);
  });

  it("a source call that failed (no record) leaves later branch points: the branch is answered by the source's retry, and samples once the source's answers below the point are given", async () => {
    const fault = (mode: string) => h.sim.inject({ method: "POST", url: "/sim/faults", payload: { mode } });
    const src = await open(h);
    const client = sdk(h, src);
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: user }];
    for (let i = 0; i < 8; i++) {
      if (i === 1) {
        // The engine fails the second step once: the source's call 1 has no record; the agent asks again (call 2).
        await fault("error");
        await expect(client.chat.completions.create({ model: "m", messages, tools: TOOLS })).rejects.toThrow();
        await fault("none");
      }
      const msg = (await client.chat.completions.create({ model: "m", messages, tools: TOOLS })).choices[0]!.message;
      messages.push(msg);
      if (!msg.tool_calls?.length) break;
      for (const c of msg.tool_calls) messages.push({ role: "tool", tool_call_id: c.id, content: `ok ${i}` });
    }
    const srcRecords = await h.records(src.id);
    expect(srcRecords.map((r) => r.seq)).toEqual([0, 2, 3, 4]);
    // Branched at the source's call 3: the answers of its calls 0 and 2 are replayed, then the branch samples.
    const branch = await open(h, { replay: { session_id: src.id, calls: 3 } });
    expect(branch.status).toBe(201);
    await runAgent(h, branch, user);
    expect((await h.records(branch.id)).map((r) => r.replayed_from ?? null)).toEqual([srcRecords[0]!.id, srcRecords[1]!.id, null, null]);
    expect((await session(h, branch.id)).replay_diverged).toBeNull();
  });

  it("calls sent together across the branch point (a title request beside the first step) arrive the other way round: the one before the point is replayed, the one after it sampled", async () => {
    const title = { model: "m", messages: [{ role: "user" as const, content: "Write a title for: build a.txt" }] };
    const src = await open(h);
    await sdk(h, src).chat.completions.create(title);
    await runAgent(h, src, user);
    const srcRecords = await h.records(src.id);
    // Branched at 1: the title request is replayed, the first step sampled; the first step reaches the gateway first.
    const branch = await open(h, { replay: { session_id: src.id, calls: 1 } });
    const firstStep = await sdk(h, branch).chat.completions.create({ model: "m", messages: [{ role: "user", content: user }], tools: TOOLS });
    const titled = await sdk(h, branch).chat.completions.create(title);
    expect(firstStep.choices[0]!.message.tool_calls).toHaveLength(1);
    expect(titled.choices[0]!.message.content).toBe(srcRecords[0]!.message.content);
    expect((await h.records(branch.id)).map((r) => r.replayed_from ?? null)).toEqual([null, srcRecords[0]!.id]);
    expect((await session(h, branch.id)).replay_diverged).toBeNull();
  });

  it("a source deleted while its branch replays it: the branch's next replayed call is refused saying so, not blamed on the agent", async () => {
    const src = await open(h);
    await runAgent(h, src, user);
    const branch = await open(h, { replay: { session_id: src.id, calls: 3 } });
    const client = sdk(h, branch);
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: user }];
    const msg = (await client.chat.completions.create({ model: "m", messages, tools: TOOLS })).choices[0]!.message;
    messages.push(msg, { role: "tool", tool_call_id: msg.tool_calls![0]!.id, content: "ok 0" });
    expect((await fetch(`${h.url}/v1/sessions/${src.id}`, { method: "DELETE" })).status).toBe(204);
    const err = await client.chat.completions.create({ model: "m", messages, tools: TOOLS }).then(
      () => null,
      (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
    );
    expect(err?.status).toBe(409);
    expect(err?.message).toMatch(/source session .* was deleted/);
    expect((await session(h, branch.id)).replay_diverged).toEqual({ call: 1, message: expect.stringMatching(/was deleted/) });
  });

  it("a branch's session counts its replayed calls and their tokens, and its limits hold them: the branch has the budget its source had at the branch point", async () => {
    const upTo2 = sourceRecords.slice(0, 2).reduce((n, r) => n + r.usage.prompt_tokens + r.usage.completion_tokens, 0);
    const refused = async (limits: Record<string, number>) => {
      const branch = await open(h, { replay: { session_id: source.id, calls: 2 }, limits });
      const err = await runAgent(h, branch, user).then(
        () => null,
        (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
      );
      const s = await session(h, branch.id);
      // The two replayed calls are the session's, though the engine spent nothing on them.
      expect(s.counts).toMatchObject({ llm_calls: 2, prompt_tokens: sourceRecords[0]!.usage.prompt_tokens + sourceRecords[1]!.usage.prompt_tokens });
      expect((await h.records(branch.id)).map((r) => r.replayed_from)).toEqual([sourceRecords[0]!.id, sourceRecords[1]!.id]);
      return err;
    };
    expect((await refused({ max_total_tokens: upTo2 }))?.message).toMatch(/max_total_tokens/);
    expect((await refused({ max_llm_calls: 2 }))?.status).toBe(400);
  });

  it("an agent's calls sent together reach the gateway in another order than in the source (a title request beside the first step): each is replayed from the call that asked it", async () => {
    const title = { model: "m", messages: [{ role: "user" as const, content: "Write a title for: build a.txt" }] };
    const src = await open(h);
    expect((await sdk(h, src).chat.completions.create(title)).choices[0]!.message.content).toBeTruthy();
    await runAgent(h, src, user);
    const srcRecords = await h.records(src.id);
    const branch = await open(h, { replay: { session_id: src.id, calls: 3 } });
    // The branch's agent sends its first step before its title request.
    const firstStep = await sdk(h, branch).chat.completions.create({ model: "m", messages: [{ role: "user", content: user }], tools: TOOLS });
    const titled = await sdk(h, branch).chat.completions.create(title);
    const call = firstStep.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.function).toEqual({ name: srcRecords[1]!.message.tool_calls[0]!.function.name, arguments: srcRecords[1]!.message.tool_calls[0]!.function.arguments });
    expect(titled.choices[0]!.message.content).toBe(srcRecords[0]!.message.content);
    const records = await h.records(branch.id);
    expect(records.map((r) => r.replayed_from)).toEqual([srcRecords[1]!.id, srcRecords[0]!.id]);
    expect((await session(h, branch.id)).replay_diverged).toBeNull();
  });

  it("calls that ask the same and were answered differently in the source (parallel workers with one prompt) are each given one of those answers in the branch, not the first one twice", async () => {
    const same = { model: "m", messages: [{ role: "user" as const, content: `count to five\n#sim: ${JSON.stringify([{ text: "one two three four five" }])}` }] };
    const other = { model: "m", messages: [{ role: "user" as const, content: "Write a title for: counting" }] };
    const src = await open(h);
    // Call 0 and call 2 ask the same; call 2's answer was cut by its token budget.
    const full = await sdk(h, src).chat.completions.create({ ...same, max_tokens: 100 });
    await sdk(h, src).chat.completions.create(other);
    const cut = await sdk(h, src).chat.completions.create({ ...same, max_tokens: 2 });
    expect(cut.choices[0]!.finish_reason).toBe("length");
    const srcRecords = await h.records(src.id);
    // The branch's workers arrive in another order: both counting calls first.
    const branch = await open(h, { replay: { session_id: src.id, calls: 3 } });
    const first = await sdk(h, branch).chat.completions.create({ ...same, max_tokens: 100 });
    const second = await sdk(h, branch).chat.completions.create({ ...same, max_tokens: 2 });
    const titled = await sdk(h, branch).chat.completions.create(other);
    expect(first.choices[0]!.message.content).toBe(full.choices[0]!.message.content);
    expect(second.choices[0]).toMatchObject({ finish_reason: "length", message: { content: cut.choices[0]!.message.content } });
    expect(titled.choices[0]!.message.content).toBe(srcRecords[1]!.message.content);
    expect((await h.records(branch.id)).map((r) => r.replayed_from)).toEqual([srcRecords[0]!.id, srcRecords[2]!.id, srcRecords[1]!.id]);
  });

  it("an agent that asks something else before the branch point is refused: replay_diverged, with the call and the difference", async () => {
    const branch = await open(h, { replay: { session_id: source.id, calls: 3 } });
    // The sandbox of this run answers the second tool call differently.
    const err = await runAgent(h, branch, user, (i) => (i === 1 ? "something else" : `ok ${i}`)).then(
      () => null,
      (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
    );
    expect(err?.status).toBe(409);
    expect(err?.message).toMatch(/left the replayed rollout at call 2: message 4 differs/);
    expect((await session(h, branch.id)).replay_diverged).toEqual({ call: 2, message: expect.stringMatching(/^message 4 differs: recorded .*ok 1.*, asked .*something else/) });
  });

  it("a replayed call that asks for another rendering of the same messages (thinking off, another effort, a forced tool) is refused: the recorded answer was not sampled for that prompt", async () => {
    const first = { model: "m", messages: [{ role: "user" as const, content: user }], tools: TOOLS };
    for (const [asked, named] of [
      [{ chat_template_kwargs: { enable_thinking: false } }, /enable_thinking/],
      [{ reasoning_effort: "low" }, /reasoning_effort/],
      [{ tool_choice: "required" }, /tool_choice/],
    ] as const) {
      const branch = await open(h, { replay: { session_id: source.id, calls: 2 } });
      const err = await sdk(h, branch)
        .chat.completions.create({ ...first, ...asked } as OpenAI.ChatCompletionCreateParamsNonStreaming)
        .then(
          () => null,
          (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
        );
      expect(err?.status).toBe(409);
      expect(err?.message).toMatch(named);
      expect((await session(h, branch.id)).replay_diverged).toEqual({ call: 0, message: expect.stringMatching(named) });
      expect(await h.records(branch.id)).toEqual([]);
    }
  });

  it("a replay past what the source recorded is refused when the session is opened, not left to fail as a divergence at that call", async () => {
    const past = await fetch(`${h.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ replay: { session_id: source.id, calls: 5 } }) });
    expect(past.status).toBe(409);
    expect(((await past.json()) as { error: { type: string; message: string } }).error).toEqual({ type: "conflict", message: expect.stringMatching(/cannot be replayed to call 5: its rollout made 4 LLM calls/) });
    // The whole recorded rollout can be replayed.
    expect((await open(h, { replay: { session_id: source.id, calls: 4 } })).status).toBe(201);
  });

  it("a branch sampled on new weights: the masked replayed answers do not count as a weight change of its trace, trained ones do", async () => {
    const setWeights = (version: string) => fetch(`${h.url}/admin/weights`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ version }) });
    expect((await setWeights("step-1")).status).toBe(200);
    const src = await open(h);
    await runAgent(h, src, user);
    expect((await setWeights("step-2")).status).toBe(200);
    const stats = async (train: boolean) => {
      const branch = await open(h, { replay: { session_id: src.id, calls: 2, train } });
      await runAgent(h, branch, user);
      expect((await h.records(branch.id)).map((r) => r.weight_version)).toEqual(["step-1", "step-1", "step-2", "step-2"]);
      const t = (await (await fetch(`${h.url}/v1/sessions/${branch.id}/trajectory`)).json()) as Trajectory;
      expect(t.traces).toHaveLength(1);
      // The versions of the trained tokens (glue between answers and masked tokens have none).
      return { tokens: [...new Set(t.traces[0]!.weight_versions.filter((v) => v !== null))], stats: t.stats };
    };
    // Masked: every trainable token was sampled by step-2, as the per-token versions say.
    const masked = await stats(false);
    expect(masked.tokens).toEqual(["step-2"]);
    expect(masked.stats).toMatchObject({ weight_versions: ["step-2"], weight_changes: 0, traces_with_weight_change: 0 });
    expect(masked.stats.per_trace[0]).toMatchObject({ weight_versions: ["step-2"], weight_changes: 0 });
    // Trained: the replayed tokens are step-1's and are trained on too.
    const trained = await stats(true);
    expect(trained.tokens).toEqual(["step-1", "step-2"]);
    expect(trained.stats).toMatchObject({ weight_versions: ["step-1", "step-2"], weight_changes: 1, traces_with_weight_change: 1 });
  });

  it("a replay of a session that does not exist is refused when the session is opened", async () => {
    const res = await open(h, { replay: { session_id: "s-nope", calls: 1 } });
    expect(res.status).toBe(404);
  });
});

describe("where a branch is sampled", () => {
  it("on its source's rank (its prefix cache holds the replayed prefix) while that rank is not ROLLGATE_AFFINITY_MAX_SKEW sessions busier than the least-loaded one; then the source's next branches move, together", async () => {
    const h = await startHarness("branch-spread", { dpSize: 4 }, { ROLLGATE_AFFINITY_MAX_SKEW: "2" });
    try {
      const src = await open(h);
      await runAgent(h, src, `build a.txt\n#sim: ${JSON.stringify(steps)}`);
      const rank = async (id: string) => (await session(h, id)).assignment!.dp_rank;
      const home = await rank(src.id);
      const ranks: number[] = [];
      for (let i = 0; i < 4; i++) ranks.push(await rank((await open(h, { replay: { session_id: src.id, calls: 2 } })).id));
      // Open sessions: the source's rank 1, the others 0. The first branch joins the source (2);
      // the second would make it 3, two more than the least-loaded: it goes to another rank, and
      // the third follows it there (the prefix it replays is now cached there too).
      expect(ranks[0]).toBe(home);
      expect(ranks[1]).not.toBe(home);
      expect(ranks[2]).toBe(ranks[1]);
      expect(new Set(ranks).size).toBeGreaterThan(1);
    } finally {
      await h.close();
    }
  });
});
