/**
 * Routed experts (R3) end to end: engine-sim as an MoE model (`--moe 3,8,2
 * --enable-return-routed-experts`) on vLLM's and SGLang's wire, the gateway with `routed_experts: true`
 * on the engine, agents through the OpenAI SDK, real Redis. The oracle is engine-sim's routing
 * contract (the routing of position i is a function of the weight version and tokens 0..i), so a
 * row recorded against the wrong token shows: every merged trace and every trainer format must hold
 * exactly the routing of its own token sequence, through prefix merging and through an abort-mode
 * pause that cut a call and changed the engine's weights in the middle of it.
 */
import type { AddressInfo } from "node:net";
import { getSimState, parseMoe, routeSequence } from "@rollgate/engine-sim";
import { routedRows, unpackRoutedRows, type CompletionRecord, type RoutedExperts, type Trajectory } from "@rollgate/protocol";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHarness, type Harness } from "./__fixtures__/harness.js";

const MOE = parseMoe("3,8,2");
const TOOLS: OpenAI.ChatCompletionTool[] = [{ type: "function", function: { name: "ls", parameters: { type: "object" } } }];
const lsStep = { think: "look first", text: "checking", tool_calls: [{ name: "ls", arguments: { path: "." } }] };
const doneStep = { text: "two files" };

const sdk = (h: Harness, s: { id: string; token: string }) => new OpenAI({ baseURL: `${h.url}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });

async function trajectory<T = Trajectory>(h: Harness, sid: string, format = "rollgate"): Promise<T> {
  const res = await fetch(`${h.url}/v1/sessions/${sid}/trajectory?builder=prefix_merging&format=${format}`);
  expect(res.status).toBe(200);
  return (await res.json()) as T;
}

/** What the engine routed each position of `seq` to (all but the last), under `versionAt(i)`. */
const expected = (seq: number[], versionAt: (i: number) => string) => routeSequence(MOE, seq, versionAt);

/** A two-call agent turn: a tool call, its result, the answer; the second call's prompt extends the first. */
async function twoCalls(h: Harness, stream: boolean): Promise<string> {
  const s = await h.openSession();
  const client = sdk(h, s);
  const user = `list files ${Math.random()}\n#sim: ${JSON.stringify([lsStep, doneStep])}`;
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: user }];
  const first = stream
    ? await client.chat.completions.stream({ model: "m", messages, tools: TOOLS }).finalChatCompletion()
    : await client.chat.completions.create({ model: "m", messages, tools: TOOLS });
  const msg = first.choices[0]!.message;
  const call = msg.tool_calls![0]!;
  messages.push(msg, { role: "tool", tool_call_id: call.id, content: "a.txt b.txt" });
  const second = stream
    ? await client.chat.completions.stream({ model: "m", messages, tools: TOOLS }).finalChatCompletion()
    : await client.chat.completions.create({ model: "m", messages, tools: TOOLS });
  expect(second.choices[0]!.message.content).toBe("two files");
  return s.id;
}

function checkRecord(r: CompletionRecord, version: string) {
  expect(r.routed_experts).toBeDefined();
  const seq = r.prompt_ids.concat(r.output_ids);
  expect(routedRows(r.routed_experts!)).toBe(seq.length - 1);
  const rows = unpackRoutedRows(r.routed_experts!);
  const want = expected(seq, () => version);
  // vLLM reports prefix-cache hits as rows of -1; every other row is the engine's routing of that position.
  rows.forEach((row, i) => {
    if (row.every((e) => e === -1)) return;
    expect(row, `position ${i} of record ${r.seq}`).toEqual(want[i]);
  });
}

for (const kind of ["vllm", "sglang"] as const) {
  describe(`routed experts on ${kind}`, () => {
    let h: Harness;
    let version: string;
    beforeAll(async () => {
      h = await startHarness(`r3-${kind}`, { kind, moe: MOE, returnRoutedExperts: true }, {}, undefined, undefined, { routed_experts: true });
      version = getSimState(h.sim).weightVersion;
    });
    afterAll(async () => h?.close());

    for (const stream of [false, true]) {
      it(`${stream ? "streamed" : "non-streamed"} calls: every record and the merged trace hold the routing of their own tokens`, async () => {
        const sid = await twoCalls(h, stream);
        const records = await h.records(sid);
        expect(records).toHaveLength(2);
        for (const r of records) checkRecord(r, version);
        expect(records[0]!.routed_experts!.width).toBe(MOE.layers * MOE.topk);
        if (kind === "vllm") expect(records[0]!.routed_experts).toMatchObject({ layers: MOE.layers, topk: MOE.topk });

        const t = await trajectory(h, sid);
        expect(t.traces).toHaveLength(1);
        expect(t.stats.merged_records).toBe(1);
        const trace = t.traces[0]!;
        const seq = trace.prompt_ids.concat(trace.response_ids);
        // The merged rows: each the routing of exactly that position. Only positions the first call
        // was served from the prefix cache (another session's identical tools prompt) may be unknown:
        // vLLM reports those as -1 and no later record of this session covers them again.
        const want = expected(seq, () => version);
        const cached = kind === "vllm" ? records[0]!.usage.cached_tokens : 0;
        unpackRoutedRows(trace.routed_experts!).forEach((row, i) => {
          if (i < cached && row.every((e) => e === -1)) return;
          expect(row, `position ${i}`).toEqual(want[i]);
        });
      });
    }

    it("every trainer format carries the trace's routing", async () => {
      const sid = await twoCalls(h, false);
      const t = await trajectory(h, sid);
      const routed = t.traces[0]!.routed_experts!;
      const verl = await trajectory<{ samples: { routed_experts: RoutedExperts }[] }>(h, sid, "verl");
      const slime = await trajectory<{ samples: { rollout_routed_experts: RoutedExperts; tokens: number[] }[] }>(h, sid, "slime");
      const prime = await trajectory<{ samples: { routed_experts: RoutedExperts }[] }>(h, sid, "prime-rl");
      expect(verl.samples[0]!.routed_experts).toEqual(routed);
      expect(prime.samples[0]!.routed_experts).toEqual(routed);
      expect(slime.samples[0]!.rollout_routed_experts).toEqual(routed);
      expect(routedRows(routed)).toBe(slime.samples[0]!.tokens.length - 1);
    });
  });
}

describe("an engine that does not return routed experts", () => {
  let h: Harness;
  beforeAll(async () => {
    // routed_experts asked for, but the engine runs without --enable-return-routed-experts.
    h = await startHarness("r3-missing", { moe: MOE }, {}, undefined, undefined, { routed_experts: true });
  });
  afterAll(async () => h?.close());

  it("fails the call (a lost call, noted on the session) instead of recording tokens without their routing", async () => {
    const s = await h.openSession();
    const err = await sdk(h, s)
      .chat.completions.create({ model: "m", messages: [{ role: "user", content: `hi\n#sim: ${JSON.stringify([doneStep])}` }] })
      .then(() => null, (e: unknown) => e as InstanceType<typeof OpenAI.APIError>);
    expect(err?.status).toBe(502);
    expect(err?.message).toMatch(/no routed experts/);
    expect(await h.records(s.id)).toEqual([]);
    const t = await trajectory(h, s.id);
    expect(t.stats.failed_calls).toEqual([expect.objectContaining({ seq: 0, kind: "bad_response" })]);
  });
});

describe("routed experts through an abort-mode pause continuation (SGLang)", () => {
  let h: Harness;
  beforeAll(async () => {
    // No SGLang parser names: the gateway cannot follow an in-place pause, so an abort cuts calls and
    // the qwen3 gateway parser continues them token-in through /generate (pause-abort.test.ts).
    const noEngineParsers = { extends: "qwen3", engine_parsers: { sglang: { tool_call_parser: null, reasoning_parser: null } } };
    h = await startHarness("r3-abort", { kind: "sglang", tpotMs: 20, moe: MOE, returnRoutedExperts: true }, {}, undefined, noEngineParsers, { routed_experts: true });
  });
  afterAll(async () => h?.close());

  const admin = async (path: string, body: unknown = {}) =>
    (await (await fetch(`${h.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })).json()) as Record<string, unknown>;

  for (const stream of [false, true]) {
    it(`${stream ? "streamed" : "non-streamed"}: the rows stay on their tokens, each under the weights that routed it`, async () => {
      await admin("/admin/weights", { version: "s1" });
      const before = getSimState(h.sim).weightVersion;
      const s = await h.openSession();
      const long = { ...lsStep, tokens: 60 };
      const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `list it ${Math.random()}\n#sim: ${JSON.stringify([long])}` }];
      const call = stream
        ? sdk(h, s).chat.completions.stream({ model: "m", messages, tools: TOOLS }).finalChatCompletion()
        : sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS });
      await new Promise((r) => setTimeout(r, 300));
      const paused = await admin("/admin/inference/pause", { mode: "abort", timeout_s: 5 });
      expect(paused).toMatchObject({ engines: [expect.objectContaining({ plan: "abort_continue" })] });
      // The engine loads new weights while paused: the continuation is routed under them.
      const loaded = await fetch(`http://127.0.0.1:${(h.sim.server.address() as AddressInfo).port}/update_weights_from_disk`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model_path: "/ckpt/step-2" }),
      });
      expect(loaded.status).toBe(200);
      const after = getSimState(h.sim).weightVersion;
      expect(after).not.toBe(before);
      await admin("/admin/weights", { version: "s2" });
      await admin("/admin/inference/resume");
      const res = await call;
      expect(res.choices[0]!.finish_reason).toBe("tool_calls");

      const [rec] = await h.records(s.id);
      expect(rec!.continued_after_pause).toBe(1);
      const cutTokens = rec!.output_weight_versions!.filter((v) => v === "s1").length;
      expect(cutTokens).toBeGreaterThan(0);
      expect(cutTokens).toBeLessThan(rec!.output_ids.length);
      // Positions up to the last token the first piece fed were routed under the old weights; the
      // continuation (prompt + cut tokens prefilled again, then the rest) under the new.
      const seq = rec!.prompt_ids.concat(rec!.output_ids);
      const boundary = rec!.prompt_ids.length + cutTokens - 1;
      const want = expected(seq, (i) => (i < boundary ? before : after));
      expect(unpackRoutedRows(rec!.routed_experts!)).toEqual(want);
      const t = await trajectory(h, s.id);
      expect(unpackRoutedRows(t.traces[0]!.routed_experts!)).toEqual(want);
    });
  }
});

describe("routed experts through a freeze-in-place pause (vLLM keep)", () => {
  let h: Harness;
  let simUrl: string;
  beforeAll(async () => {
    h = await startHarness("r3-keep", { tpotMs: 15, moe: MOE, returnRoutedExperts: true }, {}, undefined, undefined, { routed_experts: true });
    simUrl = `http://127.0.0.1:${(h.sim.server.address() as AddressInfo).port}`;
  });
  afterAll(async () => h?.close());
  const post = async (url: string, body: unknown = {}) =>
    (await (await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })).json()) as Record<string, unknown>;

  it("the engine's routing of every position under the weights that fed it; versions unknown rather than guessed", async () => {
    await post(`${h.url}/admin/weights`, { version: "a" });
    await post(`${simUrl}/sim/weights`, { version: "a" });
    const s = await h.openSession();
    const step = { ...lsStep, tokens: 60 };
    const call = sdk(h, s).chat.completions.create({ model: "m", messages: [{ role: "user", content: `list ${Math.random()}\n#sim: ${JSON.stringify([step])}` }], tools: TOOLS });
    await new Promise((r) => setTimeout(r, 350));
    const paused = await post(`${h.url}/admin/inference/pause`, { mode: "abort", timeout_s: 5 });
    expect(paused).toMatchObject({ engines: [expect.objectContaining({ plan: "keep" })] });
    await post(`${h.url}/admin/weights`, { version: "b" });
    await post(`${simUrl}/sim/weights`, { version: "b" });
    await post(`${h.url}/admin/inference/resume`);
    expect((await call).choices[0]!.finish_reason).toBe("tool_calls");

    const [rec] = await h.records(s.id);
    const seq = rec!.prompt_ids.concat(rec!.output_ids);
    const rows = unpackRoutedRows(rec!.routed_experts!);
    expect(rows).toHaveLength(seq.length - 1);
    // The prompt was routed under "a"; the last positions (fed after resume) under "b".
    expect(rows[0]).toEqual(expected(seq, () => "a")[0]);
    expect(rows.at(-1)).toEqual(expected(seq, () => "b").at(-1));
    // A whole answer does not say which tokens came before the weight change: no version is claimed.
    expect(rec!.weight_version).toBeNull();
    expect(rec!.output_weight_versions ?? rec!.output_ids.map(() => rec!.weight_version)).toEqual(rec!.output_ids.map(() => null));
    const t = await trajectory(h, s.id);
    expect(unpackRoutedRows(t.traces[0]!.routed_experts!)).toEqual(rows);
  });
});
