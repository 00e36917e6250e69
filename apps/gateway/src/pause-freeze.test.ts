/**
 * An abort-mode pause in the middle of a tool call, for every model family engine-sim serves, on a
 * vLLM with `/pause?mode=keep` (engine-sim's default release) and on SGLang (`in_place`, every call
 * read from its chat stream, which carries the ids): the engine freezes the call, the weights
 * change, and after resume the engine itself goes on and its own parsers read the whole answer,
 * whatever the family's format. The agent (the OpenAI SDK) gets one well-formed answer
 * with the tool call parsed, streamed or not; the gateway read the answer as it arrived and stamped
 * each token with the weight version current then. The stamps are checked against the engine's own
 * logprobs, which are a documented function of (weight version, context, token): every token's
 * logprob is the one its stamped version gives, so the split point is exactly right.
 */
import type { CompletionRecord } from "@rollgate/protocol";
import { simLogprob } from "@rollgate/engine-sim";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHarness, type Harness } from "./__fixtures__/harness.js";

const TOOLS: OpenAI.ChatCompletionTool[] = [
  { type: "function", function: { name: "ls", parameters: { type: "object", properties: { path: { type: "string" } } } } },
];

/** A long tool-call answer each family can write (its format decides what a step may hold). */
const STEPS: Record<string, Record<string, unknown>> = {
  qwen3: { think: "look around first", text: "checking", tool_calls: [{ name: "ls", arguments: { path: "." } }], tokens: 60 },
  "qwen3-coder": { text: "checking the folder", tool_calls: [{ name: "ls", arguments: { path: "." } }], tokens: 60 },
  // A Llama 3.1 tool-call answer is the call's JSON alone (nothing to pad): a long argument makes it long.
  "llama3.1": { tool_calls: [{ name: "ls", arguments: { path: `./${"deeply/nested/".repeat(25)}` } }] },
  "deepseek-v3": { text: "checking the folder", tool_calls: [{ name: "ls", arguments: { path: "." } }], tokens: 60 },
  "deepseek-v3.1": { text: "checking the folder", tool_calls: [{ name: "ls", arguments: { path: "." } }], tokens: 60 },
  "gpt-oss": { think: "look around first", tool_calls: [{ name: "ls", arguments: { path: "." } }], tokens: 60 },
};

async function post(url: string, body: unknown = {}) {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return (await res.json()) as Record<string, unknown>;
}

const sdk = (h: Harness, s: { id: string; token: string }) => new OpenAI({ baseURL: `${h.url}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });

for (const [family, kind] of Object.keys(STEPS).flatMap((f) => [[f, "vllm"] as const, [f, "sglang"] as const])) {
  describe(`freeze-in-place pause mid tool call: ${family} (${kind})`, () => {
    let h: Harness;
    let simUrl: string;
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `list it\n#sim: ${JSON.stringify([STEPS[family]])}` }];

    beforeAll(async () => {
      h = await startHarness(`pause-freeze-${family.replace(".", "")}-${kind}`, { family: family as never, kind, tpotMs: 15, startDate: "2026-01-05" });
      simUrl = `http://127.0.0.1:${(h.sim.server.address() as { port: number }).port}`;
    });
    afterAll(async () => h?.close());

    /** Weights "a" on both sides; pause once the call has some tokens; weights "b" on both; resume. */
    async function pauseMidCall(afterMs = 350) {
      await new Promise((r) => setTimeout(r, afterMs));
      const paused = await post(`${h.url}/admin/inference/pause`, { mode: "abort", timeout_s: 5 });
      await post(`${h.url}/admin/weights`, { version: "b" });
      await post(`${simUrl}/sim/weights`, { version: "b" });
      await post(`${h.url}/admin/inference/resume`);
      return paused;
    }

    async function start() {
      await post(`${h.url}/admin/weights`, { version: "a" });
      await post(`${simUrl}/sim/weights`, { version: "a" });
      return h.openSession();
    }

    /** Every token's logprob is the engine's under the version it is stamped with; the versions run a… then b…. */
    function stampsAreExact(rec: CompletionRecord) {
      const v = rec.output_weight_versions!;
      expect(v, "the record carries per-token versions").toHaveLength(rec.output_ids.length);
      const at = v.indexOf("b");
      expect(at, "some tokens before the pause").toBeGreaterThan(0);
      expect(v).toEqual([...Array(at).fill("a"), ...Array(v.length - at).fill("b")]);
      rec.output_ids.forEach((id, i) => expect(rec.output_logprobs[i]).toBe(simLogprob(v[i]!, [...rec.prompt_ids, ...rec.output_ids.slice(0, i)], id)));
      expect(rec.weight_version).toBe("b");
      expect(rec.continued_after_pause).toBeUndefined();
    }

    it("non-streamed: the engine freezes the call; one answer, tool call parsed; stamps exact", async () => {
      const s = await start();
      const call = sdk(h, s).chat.completions.create({ model: "m", messages, tools: TOOLS });
      const paused = await pauseMidCall();
      const plan = kind === "vllm" ? "keep" : "in_place";
      expect(paused).toMatchObject({ mode: "abort", frozen: 1, engines: [expect.objectContaining({ plan, mode: plan, ok: true })] });
      const res = await call;
      expect(res.choices[0]!.finish_reason).toBe("tool_calls");
      const step = STEPS[family] as { tool_calls: { arguments: unknown }[] };
      expect(res.choices[0]!.message.tool_calls?.map((c) => c.type === "function" && { name: c.function.name, args: JSON.parse(c.function.arguments) })).toEqual([
        { name: "ls", args: step.tool_calls[0]!.arguments },
      ]);
      stampsAreExact((await h.records(s.id))[0]!);
    });

    it("streamed: one stream with one finish, tool call parsed; stamps exact", async () => {
      const s = await start();
      const finishes: string[] = [];
      const stream = sdk(h, s).chat.completions.stream({ model: "m", messages, tools: TOOLS });
      stream.on("chunk", (c) => {
        if (c.choices[0]?.finish_reason) finishes.push(c.choices[0].finish_reason);
      });
      await pauseMidCall();
      const final = await stream.finalChatCompletion();
      expect(finishes).toEqual(["tool_calls"]);
      expect(final.choices[0]!.message.tool_calls?.map((c) => c.type === "function" && c.function.name)).toEqual(["ls"]);
      stampsAreExact((await h.records(s.id))[0]!);
    });
  });
}
