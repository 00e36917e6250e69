/**
 * What a trainer finally consumes, from a real session (OpenAI SDK agent → gateway → engine-sim on
 * the real Qwen3 tokenizer, real Redis): a conversation with a tool call, an answer cut by
 * `max_tokens` and continued, a retry of an earlier call (a sibling), and a side request without
 * tools; for several model families, on vLLM and on SGLang. For every builder and every trainer format: one sample per trace, every array of a sample
 * as long as its tokens, every trainable token exactly the engine's token at that position with
 * the engine's own logprob (engine-sim's logprob is a pure function of the context, so the test
 * recomputes it), prompt and glue never trainable, each sampled token trainable once, and each
 * format's length / truncation fields as its trainer reads them.
 */
import { getSimState, simLogprob, type FamilyName } from "@rollgate/engine-sim";
import { PRESETS } from "@rollgate/models";
import type { CompletionRecord, Trace, Trajectory } from "@rollgate/protocol";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PROFILE_OF_FAMILY, startHarness, type Harness } from "./__fixtures__/harness.js";

const TOOLS: OpenAI.ChatCompletionTool[] = [{ type: "function", function: { name: "shell", parameters: { type: "object", properties: { command: { type: "string" } } } } }];
const LONG = Array.from({ length: 40 }, (_, i) => `word${i}`).join(" ");
const steps = [{ think: "use the shell", tool_calls: [{ name: "shell", arguments: { command: "ls" } }] }, { text: `The listing says ${LONG}.` }, { text: "Finished." }];

type Samples = { builder: string; format: string; samples: Record<string, unknown>[] };

const FAMILIES: FamilyName[] = ["qwen3", "llama3.1", "deepseek-v3.1", "gpt-oss"];

describe.each(FAMILIES.flatMap((family) => (["vllm", "sglang"] as const).map((kind) => ({ family, kind }))))("trainer formats of a real session: $family on $kind", ({ family, kind }) => {
  // A family whose profile turns token-in off re-renders echoed turns (gpt-oss: harmony), so its calls break, each break named.
  const oneConversation = PRESETS[PROFILE_OF_FAMILY[family]!]!.token_in !== "off";
  let h: Harness;
  let sid = "";
  let records: CompletionRecord[] = [];
  const get = async <T>(query: string): Promise<T> => {
    const res = await fetch(`${h.url}/v1/sessions/${sid}/trajectory?${query}`);
    expect(res.status).toBe(200);
    return (await res.json()) as T;
  };

  beforeAll(async () => {
    h = await startHarness("trainer-formats", { kind, family });
    const s = await h.openSession();
    sid = s.id;
    const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `List the files.\n#sim: ${JSON.stringify(steps)}` }];
    const first = (await client.chat.completions.create({ model: "m", messages, tools: TOOLS })).choices[0]!.message;
    messages.push(first, { role: "tool", tool_call_id: first.tool_calls![0]!.id, content: "a.txt b.txt" });
    // A retry of the call just made: the same request again (a sibling trace).
    await client.chat.completions.create({ model: "m", messages, tools: TOOLS, max_tokens: 12 });
    const cut = await client.chat.completions.create({ model: "m", messages, tools: TOOLS, max_tokens: 12 });
    expect(cut.choices[0]!.finish_reason).toBe("length");
    messages.push(cut.choices[0]!.message, { role: "user", content: "go on" });
    await client.chat.completions.create({ model: "m", messages, tools: TOOLS });
    // A side request: no tools, while the agent's requests have them.
    await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "Title for: list the files" }] });
    records = await h.records(sid);
    expect(records).toHaveLength(5);
  }, 60_000);
  afterAll(async () => h?.close());

  /** Every trainable token is the engine's, at its record's position, with the engine's logprob; everything else mask 0, logprob 0. */
  function expectEngineExact(t: Trajectory): void {
    const version = getSimState(h.sim).weightVersion;
    const byId = new Map(records.map((r) => [r.id, r]));
    const trainedOnce = new Map<string, number>();
    t.traces.forEach((trace: Trace, i) => {
      const n = trace.response_ids.length;
      expect([trace.loss_mask.length, trace.response_logprobs.length, trace.weight_versions.length]).toEqual([n, n, n]);
      const first = byId.get(trace.completion_ids[0]!)!;
      expect(trace.prompt_ids).toEqual(first.prompt_ids);
      const full = trace.prompt_ids.concat(trace.response_ids);
      for (const span of t.stats.per_trace[i]!.spans) {
        const r = byId.get(span.record_id)!;
        // The record's prompt is the trace's tokens up to its output, its output the span's tail.
        expect(full.slice(0, trace.prompt_ids.length + span.output_start)).toEqual(r.prompt_ids);
        expect(trace.response_ids.slice(span.output_start, span.end)).toEqual(r.output_ids);
        for (let k = span.start; k < span.output_start; k++) expect([trace.loss_mask[k], trace.response_logprobs[k], trace.weight_versions[k]]).toEqual([0, 0, null]);
        for (let k = span.output_start; k < span.end; k++) {
          const at = trace.prompt_ids.length + k;
          expect(trace.loss_mask[k]).toBe(1);
          expect(trace.response_logprobs[k]).toBe(simLogprob(version, full.slice(0, at), full[at]!));
        }
        trainedOnce.set(r.id, (trainedOnce.get(r.id) ?? 0) + 1);
      }
      expect(t.stats.per_trace[i]!.spans.at(-1)!.end).toBe(n);
    });
    expect([...trainedOnce.keys()].sort()).toEqual(records.map((r) => r.id).sort());
    expect([...trainedOnce.values()].every((c) => c === 1)).toBe(true);
  }

  for (const builder of ["per_request", "prefix_merging", "prefix_tree"] as const) {
    it(`${builder}: every trainable token is the engine's own, once; every format says the same`, async () => {
      const t = await get<Trajectory>(`builder=${builder}`);
      expectEngineExact(t);
      expect(t.stats.breaks.filter((b) => b.reason === "unknown")).toEqual([]);
      if (builder !== "per_request" && oneConversation) {
        // The retry and the side request are traces of their own; the cut answer and its continuation are one.
        expect(t.traces.map((x) => x.completion_ids.length).sort()).toEqual([1, 1, 3]);
        expect(t.traces.map((x) => x.kind).sort()).toEqual(["main", "main", "side_request"]);
      }
      const verl = await get<Samples>(`builder=${builder}&format=verl`);
      const slime = await get<Samples>(`builder=${builder}&format=slime`);
      const prime = await get<Samples>(`builder=${builder}&format=prime-rl`);
      for (const f of [verl, slime, prime]) expect(f.samples).toHaveLength(t.traces.length);
      t.traces.forEach((trace, i) => {
        const cut = trace.finish_reason === "length";
        expect(verl.samples[i]).toEqual({ prompts: trace.prompt_ids, responses: trace.response_ids, response_mask: trace.loss_mask, rollout_log_probs: trace.response_logprobs });
        expect(slime.samples[i]).toEqual({
          tokens: trace.prompt_ids.concat(trace.response_ids),
          response_length: trace.response_ids.length,
          loss_mask: trace.loss_mask,
          rollout_log_probs: trace.response_logprobs,
          status: cut ? "truncated" : "completed",
        });
        expect(prime.samples[i]).toEqual({
          prompt_ids: trace.prompt_ids,
          prompt_mask: trace.prompt_ids.map(() => 0),
          completion_ids: trace.response_ids,
          completion_mask: trace.loss_mask,
          completion_logprobs: trace.response_logprobs,
          overlong_prompt: false,
          is_truncated: cut,
        });
      });
      // The cut answer alone (per_request) or the retry cut the same way is truncated; the continued conversation is not.
      expect(t.traces.filter((x) => x.finish_reason === "length").length).toBe(builder === "per_request" || !oneConversation ? 2 : 1);
    });
  }
});
