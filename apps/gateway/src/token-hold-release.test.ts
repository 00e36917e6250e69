/**
 * A session's max_total_tokens holds (llm/token-budget.ts) are given back by every call that ends
 * without a record: an agent that leaves its streamed call part way, or a call the agent gives up
 * on while it waits for the session's other calls. The session's next call then gets what is left
 * instead of waiting for ever. OpenAI SDK against the gateway and an in-process engine-sim, real Redis.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHarness, type Harness } from "./__fixtures__/harness.js";

const LONG = `Tell me a story.\n#sim: ${JSON.stringify([{ text: "Once", tokens: 400 }])}`;

let h: Harness;
beforeAll(async () => {
  // Slow tokens: a streamed answer of 400 tokens is still running when the agent leaves it.
  h = await startHarness("tokhold", { dpSize: 1, tpotMs: 20 });
});
afterAll(() => h?.close());

async function limited(maxTotalTokens: number) {
  const res = await fetch(`${h.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ limits: { max_total_tokens: maxTotalTokens } }) });
  expect(res.status).toBe(201);
  return (await res.json()) as { id: string; token: string; urls: { openai: string } };
}

describe("max_total_tokens holds", () => {
  it("a streamed call the agent leaves part way gives its hold back: the next call is answered", async () => {
    const s = await limited(1_000);
    const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
    const leaving = new AbortController();
    const stream = await client.chat.completions.create({ model: "m", stream: true, messages: [{ role: "user", content: LONG }] }, { signal: leaving.signal });
    let chunks = 0;
    // The SDK ends the iteration (or throws) once the agent aborts: either way the call is left.
    await (async () => {
      for await (const _ of stream) if (++chunks === 3) leaving.abort();
    })().catch(() => undefined);
    expect(chunks).toBe(3);
    // The first call held most of the budget while it ran: the second needs it back to fit at all.
    const next = await client.chat.completions.create({ model: "m", max_tokens: 5, messages: [{ role: "user", content: LONG }] });
    expect(next.choices[0]!.finish_reason).toBe("length");
    expect(await h.records(s.id)).toHaveLength(1);
  });

  it("a call the agent gives up on while it waits for another's hold leaves no hold behind", async () => {
    const s = await limited(1_000);
    const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
    const first = client.chat.completions.create({ model: "m", messages: [{ role: "user", content: LONG }] });
    // Started once the first holds its worst case: it cannot fit beside it and waits.
    await new Promise((r) => setTimeout(r, 300));
    const giving = new AbortController();
    const waiting = client.chat.completions.create({ model: "m", max_tokens: 600, messages: [{ role: "user", content: "hi" }] }, { signal: giving.signal }).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    giving.abort();
    expect(await waiting).toBeInstanceOf(Error);
    // The first fits whole (its 400 tokens are below what was left), so it ends on its own.
    expect((await first).choices[0]!.finish_reason).toBe("stop");
    // Had the waiting call left a hold, this one (which fits beside nothing else) would wait for ever.
    const after = await client.chat.completions.create({ model: "m", max_tokens: 5, messages: [{ role: "user", content: "hi" }] });
    expect(after.choices[0]!.finish_reason).toBe("length");
    const used = (await h.records(s.id)).reduce((n, r) => n + r.prompt_ids.length + r.output_ids.length, 0);
    expect(used).toBeLessThanOrEqual(1_000);
  });
});
