/**
 * A session's max_total_tokens holds: the call that reaches it is cut short (the engine is asked
 * for no more than what is left), the agent sees a turn cut by length, and the next call is the
 * 400 session_token_limit. Through the official OpenAI and Anthropic SDKs against the gateway and
 * an in-process engine-sim (vLLM, then SGLang), on the real Redis under a test key prefix.
 */
import Anthropic from "@anthropic-ai/sdk";
import type { CompletionRecord } from "@rollgate/protocol";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import Fastify from "fastify";
import { listenLocal, startHarness, startSimFleet, type Harness } from "./__fixtures__/harness.js";

// An answer far longer than any limit below.
const LONG = `Tell me a story.\n#sim: ${JSON.stringify([{ text: "Once", tokens: 400 }, { text: "More", tokens: 400 }])}`;

async function limited(h: Harness, maxTotalTokens: number) {
  const res = await fetch(`${h.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ limits: { max_total_tokens: maxTotalTokens } }) });
  expect(res.status).toBe(201);
  return (await res.json()) as { id: string; token: string; urls: { openai: string; anthropic: string } };
}

const used = (records: CompletionRecord[]) => records.reduce((n, r) => n + r.prompt_ids.length + r.output_ids.length, 0);

// Continuation `token_in`: a call that echoes the session's answers goes token-in, its prompt counted before it is sent.
for (const [kind, continuation] of [["vllm", "auto"], ["sglang", "auto"], ["vllm", "token_in"], ["sglang", "token_in"]] as const) {
  describe(`max_total_tokens on ${kind}, continuation ${continuation}`, () => {
    let h: Harness;
    beforeAll(async () => {
      h = await startHarness(`toklim-${kind}`, { dpSize: 1, kind }, { ROLLGATE_CONTINUATION: continuation });
    });
    afterAll(() => h?.close());

    it("OpenAI, no max_tokens sent: the crossing call ends on length within the limit, the next is the 400", async () => {
      const s = await limited(h, 150);
      const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
      const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: LONG }];
      const first = await client.chat.completions.create({ model: "m", messages });
      expect(first.choices[0]!.finish_reason).toBe("length");
      const records = await h.records(s.id);
      expect(records).toHaveLength(1);
      // The engine was asked for exactly what was left after the prompt: the session is used up, not overshot.
      expect(used(records)).toBe(150);
      messages.push({ role: "assistant", content: first.choices[0]!.message.content }, { role: "user", content: "go on" });
      const next = await client.chat.completions.create({ model: "m", messages }).catch((e: unknown) => e);
      expect(next).toBeInstanceOf(OpenAI.BadRequestError);
      expect((next as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("session_token_limit");
      expect(await h.records(s.id)).toHaveLength(1);
    });

    it("Anthropic, streamed: a max_tokens larger than what is left is capped (stop_reason max_tokens); a continuation whose prompt does not fit is refused", async () => {
      const s = await limited(h, 400);
      const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
      const messages: Anthropic.MessageParam[] = [{ role: "user", content: `Short first.\n#sim: ${JSON.stringify([{ text: "Fine." }, { text: "Twice", tokens: 400 }])}` }];
      const first = await client.messages.create({ model: "claude", max_tokens: 1000, messages });
      expect(first.stop_reason).toBe("end_turn");
      messages.push({ role: "assistant", content: first.content }, { role: "user", content: "Now the long one." });
      const second = await client.messages.stream({ model: "claude", max_tokens: 1000, messages }).finalMessage();
      expect(second.stop_reason).toBe("max_tokens");
      const records = await h.records(s.id);
      expect(records).toHaveLength(2);
      expect(used(records)).toBeLessThanOrEqual(400);
      // What is left is less than the next prompt (it holds both earlier answers): refused before any engine call.
      messages.push({ role: "assistant", content: second.content }, { role: "user", content: "And again." });
      const third = await client.messages.create({ model: "claude", max_tokens: 1000, messages }).catch((e: unknown) => e);
      expect(third).toBeInstanceOf(Anthropic.BadRequestError);
      expect(((third as InstanceType<typeof Anthropic.BadRequestError>).error as { error: { type: string } }).error.type).toBe("invalid_request_error");
      expect((third as Error).message).toMatch(/max_total_tokens/);
      expect(await h.records(s.id)).toHaveLength(2);
    });

    it("a call whose prompt alone is more than what is left is refused before the engine is asked", async () => {
      const ask = (client: OpenAI, messages: OpenAI.ChatCompletionMessageParam[]) => client.chat.completions.create({ model: "m", messages, max_tokens: 50 });
      const first: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `Short.\n#sim: ${JSON.stringify([{ text: "Fine." }, { text: "Again." }])}` }];
      // The first call's tokens, measured on a session without a limit.
      const probe = await h.openSession();
      await ask(new OpenAI({ apiKey: probe.token, baseURL: probe.urls.openai, maxRetries: 0 }), first);
      const firstUse = used(await h.records(probe.id));
      const s = await limited(h, firstUse + 3);
      const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
      const answer = await ask(client, first);
      expect(answer.choices[0]!.finish_reason).toBe("stop");
      const refused = await ask(client, [...first, { role: "assistant", content: answer.choices[0]!.message.content }, { role: "user", content: "more" }]).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
      expect((refused as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("session_token_limit");
      expect((refused as Error).message).toMatch(/prompt \(\d+ tokens\) does not fit .* 3 tokens/);
      expect(used(await h.records(s.id))).toBe(firstUse);
    });

    it("parallel calls share what is left: together they never overshoot it", async () => {
      const s = await limited(h, 300);
      const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
      const answers = await Promise.allSettled([0, 1, 2, 3].map(() => client.chat.completions.create({ model: "m", messages: [{ role: "user", content: LONG }] })));
      const records = await h.records(s.id);
      expect(used(records)).toBeLessThanOrEqual(300);
      expect(answers.some((a) => a.status === "fulfilled" && a.value.choices[0]!.finish_reason === "length")).toBe(true);
      for (const a of answers) if (a.status === "rejected") expect((a.reason as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("session_token_limit");
    });
  });
}

describe("an engine whose prompt cannot be counted (no /tokenize)", () => {
  it("the call still goes, its answer capped at what the session has left", async () => {
    const asked: unknown[] = [];
    const engine = Fastify();
    engine.get("/v1/models", async () => ({ data: [{ id: "m" }] }));
    engine.post("/v1/chat/completions", async (req) => {
      asked.push((req.body as { max_tokens?: unknown }).max_tokens);
      return {
        prompt_token_ids: [1, 2, 3],
        choices: [{ message: { content: "ab" }, finish_reason: "length", token_ids: [7, 8], logprobs: { content: [{ token: "a", logprob: -1 }, { token: "b", logprob: -1 }] } }],
        usage: { prompt_tokens: 3, completion_tokens: 2 },
      };
    });
    const url = await listenLocal(engine);
    const fleet = await startSimFleet("toklim-notokenize");
    const gw = await fleet.gateway({ engines: [{ kind: "vllm", url, dp_size: 1 }], env: { ROLLGATE_HEALTH_INTERVAL_S: "0" } });
    try {
      const s = (await gw.inject({ method: "POST", url: "/v1/sessions", payload: { limits: { max_total_tokens: 40 } } })).json() as { id: string; token: string };
      const res = await gw.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
        payload: { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 500 },
      });
      expect(res.statusCode).toBe(200);
      // (The gateway's capability probe asks for one token first.)
      expect(asked.at(-1)).toBe(40);
    } finally {
      await gw.close();
      await fleet.close();
      await engine.close();
    }
  });
});
