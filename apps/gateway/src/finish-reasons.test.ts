/**
 * Finish reasons that do not end an answer of the model. An engine may end a call with vLLM's
 * "error" (the request failed part way), or a reason this gateway does not know (a newer engine's):
 * the tokens so far are not the policy's answer, and Anthropic, Gemini and Responses agents would
 * see them as a finished turn the reward scores. The call fails (502, the session counts it lost),
 * nothing is recorded. vLLM's "repetition" (its repetition detection cut a looping answer) is a
 * cut by a limit: told and recorded as "length". Through the official SDKs against the gateway and
 * an in-process engine-sim whose `finish` fault ends each generation with the given reason.
 */
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import { getSimState } from "@rollgate/engine-sim";
import type { Session } from "@rollgate/protocol";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { startHarness, type Harness } from "./__fixtures__/harness.js";

const TEXT = `go\n#sim: ${JSON.stringify([{ text: "a long answer that the engine ends early", tokens: 40 }])}`;

type Opened = Awaited<ReturnType<Harness["openSession"]>>;
type Run = (h: Harness, s: Opened) => Promise<unknown>;
const RUNS: Record<string, Run> = {
  "openai chat": (_h, s) => new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).chat.completions.create({ model: "m", messages: [{ role: "user", content: TEXT }] }),
  "openai chat, streamed": (_h, s) =>
    new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).chat.completions.stream({ model: "m", messages: [{ role: "user", content: TEXT }] }).finalChatCompletion(),
  anthropic: (_h, s) => new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 }).messages.create({ model: "c", max_tokens: 500, messages: [{ role: "user", content: TEXT }] }),
  "anthropic, streamed": (_h, s) =>
    new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 }).messages.stream({ model: "c", max_tokens: 500, messages: [{ role: "user", content: TEXT }] }).finalMessage(),
  gemini: (h, s) => new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: `${h.url}/s/${s.id}` } }).models.generateContent({ model: "m", contents: [{ role: "user", parts: [{ text: TEXT }] }] }),
  responses: (_h, s) => new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }).responses.create({ model: "m", input: TEXT }),
};

for (const kind of ["vllm", "sglang"] as const) {
  describe(`${kind}: finish reasons that are not an answer`, () => {
    let h: Harness;
    beforeAll(async () => {
      h = await startHarness(`finish-${kind}`, { dpSize: 1, kind });
    });
    afterEach(() => getSimState(h.sim).setFault({ mode: "none" }));
    afterAll(() => h?.close());

    for (const reason of ["error", "content_filter_v2"]) {
      for (const [name, run] of Object.entries(RUNS)) {
        it(`"${reason}", ${name}: the agent gets an error, the call is lost and not recorded`, async () => {
          getSimState(h.sim).setFault({ mode: "finish", finish_reason: reason, after_tokens: 5 });
          const s = await h.openSession();
          const got = await run(h, s).then(
            (answer) => ({ answer }),
            (error: unknown) => ({ error }),
          );
          expect("error" in got ? null : got.answer, "the agent was given the ended call as a finished answer").toBeNull();
          expect((got as { error: { status?: number } }).error.status ?? 502).toBe(502);
          expect(await h.records(s.id)).toEqual([]);
          const after = (await (await fetch(`${h.url}/v1/sessions/${s.id}`)).json()) as Session;
          expect(after.lost_calls.count).toBe(1);
          expect(after.lost_calls.first?.message).toContain(`finish_reason "${reason}"`);
        });
      }
    }
  });
}

describe('vLLM "repetition": a cut by a limit, told and recorded as "length"', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness("finish-repetition", { dpSize: 1 });
    getSimState(h.sim).setFault({ mode: "finish", finish_reason: "repetition", after_tokens: 5 });
  });
  afterAll(() => h?.close());

  it("Anthropic: stop_reason max_tokens; the record's finish_reason is length", async () => {
    const s = await h.openSession();
    const answer = (await RUNS.anthropic!(h, s)) as Anthropic.Message;
    expect(answer.stop_reason).toBe("max_tokens");
    const [record] = await h.records(s.id);
    expect(record).toMatchObject({ finish_reason: "length" });
    expect(record!.output_ids).toHaveLength(5);
  });

  it("OpenAI, streamed: finish_reason length", async () => {
    const s = await h.openSession();
    const answer = (await RUNS["openai chat, streamed"]!(h, s)) as OpenAI.ChatCompletion;
    expect(answer.choices[0]!.finish_reason).toBe("length");
    expect((await h.records(s.id))[0]).toMatchObject({ finish_reason: "length" });
  });
});

for (const kind of ["vllm", "sglang"] as const) {
  describe(`${kind}, a call sent token-in (/v1/completions, /generate): the same`, () => {
    let h: Harness;
    beforeAll(async () => {
      h = await startHarness(`finish-ti-${kind}`, { dpSize: 1, kind }, { ROLLGATE_CONTINUATION: "token_in" });
    });
    afterEach(() => getSimState(h.sim).setFault({ mode: "none" }));
    afterAll(() => h?.close());

    it('an unknown reason on the continued call: 502, lost, only the first call recorded; "repetition" is length', async () => {
      const s = await h.openSession();
      const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
      const script = [{ text: "first" }, { text: "second and longer", tokens: 30 }];
      const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `go\n#sim: ${JSON.stringify(script)}` }];
      const first = await client.chat.completions.create({ model: "m", messages });
      messages.push({ role: "assistant", content: first.choices[0]!.message.content }, { role: "user", content: "again" });
      getSimState(h.sim).setFault({ mode: "finish", finish_reason: "kv_transfer_failed", after_tokens: 4 });
      const failed = await client.chat.completions.create({ model: "m", messages }).catch((e: unknown) => e);
      expect(failed).toBeInstanceOf(OpenAI.InternalServerError);
      expect((failed as InstanceType<typeof OpenAI.InternalServerError>).status).toBe(502);
      expect(await h.records(s.id)).toHaveLength(1);
      if (kind === "vllm") {
        getSimState(h.sim).setFault({ mode: "finish", finish_reason: "repetition", after_tokens: 4 });
        const cut = await client.chat.completions.create({ model: "m", messages });
        expect(cut.choices[0]!.finish_reason).toBe("length");
        const records = await h.records(s.id);
        // Sent token-in: the record continues the first one's ids.
        expect(records.at(-1)).toMatchObject({ finish_reason: "length" });
        expect(records.at(-1)!.prompt_ids.slice(0, records[0]!.prompt_ids.length)).toEqual(records[0]!.prompt_ids);
      }
    });
  });
}
