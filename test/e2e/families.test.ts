/**
 * Any model, token-exact: the example agent (examples/react-agent, on the OpenAI SDK) runs a
 * multi-turn tool conversation as a task, streamed and not, against every model family engine-sim
 * serves with its real tokenizer and template (Qwen3, Qwen3-Coder, Llama 3.1, DeepSeek-V3 and
 * V3.1, gpt-oss), as vLLM and as SGLang, through a gateway on the family's model profile and a
 * worker. Each run must be `completed` with reward 1, its trainable tokens exactly the engine's
 * output ids with their logprobs, and every trace decoded through the gateway (the engine's
 * /detokenize) must be the engine's own text of its calls, the last one the whole conversation. prefix_merging gives one trace per conversation wherever
 * the family's template lets the gateway keep the prefix; where it cannot (gpt-oss: the engine
 * renders harmony history itself and its profile turns token-in off) every break is named, in the
 * profile's words.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Preflight } from "@rollgate/protocol";
import { FAMILIES, exampleAgentTask, startFamilyStack, type Family, type FamilyStack, type Kind } from "../support/families.js";
import { apiClient } from "../support/http.js";
import { measureCell, writePreflight } from "../support/matrix.js";

/** Families whose template the gateway cannot keep a prefix through, and the break reason they give. */
const BREAKS: Partial<Record<Family, { reason: string; note: RegExp }>> = {
  "gpt-oss": { reason: "history_rewritten", note: /gpt-oss profile: the engine renders harmony history itself/ },
};

for (const family of Object.keys(FAMILIES) as Family[]) {
  for (const kind of FAMILIES[family].kinds as readonly Kind[]) {
    describe(`example agent on ${family} (${kind})`, () => {
      let stack: FamilyStack;
      beforeAll(async () => {
        stack = await startFamilyStack({ family, kind });
      }, 60_000);
      afterAll(async () => stack?.stop());

      it("preflight: the family's profile and vocabulary, checked without errors (its README row)", async () => {
        const { status, body } = await apiClient(() => stack.gatewayUrl)("/admin/engines?wait_s=60");
        expect(status).toBe(200);
        const preflight = (body as { engines: { preflight: Preflight | null }[] }).engines[0]!.preflight;
        expect(preflight, "preflight ran").not.toBeNull();
        expect(preflight!.profile).toBe(FAMILIES[family].profile);
        expect(preflight!.errors).toEqual([]);
        expect(preflight!.vocab_size).toBeGreaterThan(100_000);
        await writePreflight(family, preflight!);
      });

      it.each([false, true])("streamed %s: completed, reward 1, token-exact, decodes to the conversation", async (stream) => {
        const cell = { family, agent: "example-agent", protocol: "openai_chat", kind, variant: stream ? "streamed" : "not streamed", suite: "families" };
        await measureCell(cell, async (note) => {
          const run = await stack.runTask(exampleAgentTask(family, stream));
          note({ llm_calls: run.records.length, traces: run.traces, breaks: run.breaks.map((b) => b.reason), exact: run.exact });
          expect(run.task.status, JSON.stringify(run.task.result?.error)).toBe("completed");
          expect(run.task.result!.reward).toBe(1);
          expect(run.records).toHaveLength(3);
          expect(run.records.slice(0, 2).map((r) => r.message.tool_calls.map((c) => c.function.name))).toEqual([["shell"], ["shell"]]);
          expect(run.exact, "every trainable token is the engine's, with its logprob").toBe(true);
          expect(run.decodes, "every trace decodes to the engine's text of its calls").toBe(true);
          // The trace of the last call is the whole conversation: the task, both tool calls, the answer.
          expect(run.text).toContain("Create hello.txt containing the word hello.");
          const history = run.text.slice(run.text.indexOf("I created hello.txt.") + 1);
          expect(history).toMatch(/echo hello > hello\.txt[\s\S]*cat hello\.txt/);
          expect(run.text.trimEnd()).toMatch(/I created hello\.txt\.(<\|im_end\|>|<\|eot_id\|>|<｜end▁of▁sentence｜>|<\|return\|>)$/);
          const known = BREAKS[family];
          if (!known) {
            expect(run.traces, JSON.stringify(run.breaks)).toBe(1);
            expect(run.breaks).toEqual([]);
          } else {
            expect(run.breaks.length).toBe(run.traces - 1);
            for (const b of run.breaks) {
              expect(b.reason).toBe(known.reason);
              expect(b.detail).toMatch(known.note);
            }
          }
        });
      });
    });
  }
}
