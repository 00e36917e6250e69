import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim, getSimState } from "./app.js";
import { FAMILY_NAMES } from "./families/index.js";
import { simLogprob } from "./logprobs.js";
import { post } from "./__fixtures__/conversation.js";

// The engine's machinery is the same for every family: logprobs (predictable with simLogprob,
// alternatives drawn from the family tokenizer's ordinary ids), and pauses that cut an answer in the
// middle of a tool call (abort) or freeze it (keep) and let it finish after /resume.

const TOOLS = [{ type: "function", function: { name: "write_file", parameters: { type: "object", properties: { path: { type: "string" }, body: { type: "string" } } } } }];
const BODY = "lorem ipsum dolor sit amet ".repeat(6).trim();
const MESSAGES = [{ role: "user", content: `#sim: [{"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","body":"${BODY}"}}]}]\nWrite it.` }];

const apps: FastifyInstance[] = [];
afterAll(async () => {
  await Promise.all(apps.map((a) => a.close()));
});

describe.each(FAMILY_NAMES)("%s on the shared engine", (family) => {
  it("logprobs: one entry per token, as simLogprob predicts, with alternatives from the family's vocabulary", async () => {
    const app = buildEngineSim({ family });
    apps.push(app);
    const j = (await post(app, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true, logprobs: true, top_logprobs: 3 })).json();
    const ids: number[] = j.choices[0].token_ids;
    const entries = j.choices[0].logprobs.content as { logprob: number; top_logprobs: unknown[] }[];
    expect(entries).toHaveLength(ids.length);
    expect(entries[1]!.logprob).toBe(simLogprob("0", [...j.prompt_token_ids, ids[0]!], ids[1]!));
    expect(entries.every((e) => e.top_logprobs.length === 3)).toBe(true);
    const raw = (await post(app, "/v1/completions", { prompt: j.prompt_token_ids, max_tokens: 3, logprobs: 5, return_tokens_as_token_ids: true })).json();
    const lp = raw.choices[0].logprobs as { tokens: string[]; top_logprobs: Record<string, number>[] };
    const alternatives = lp.top_logprobs.flatMap((d, i) => Object.keys(d).filter((k) => k !== lp.tokens[i]).map((k) => Number(k.slice("token_id:".length))));
    expect(alternatives.length).toBeGreaterThanOrEqual(3 * 4);
    expect(alternatives.every((id) => id < getSimState(app).tok.regularVocabSize)).toBe(true);
  });

  it("abort mid-call: the answer ends with finish_reason abort and its partial tokens; keep: it finishes after /resume", async () => {
    const app = buildEngineSim({ family, tpotMs: 4 });
    apps.push(app);
    const full = (await post(app, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true })).json().choices[0].token_ids as number[];
    const cut = post(app, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true });
    await sleep(4 * Math.floor(full.length / 2));
    await post(app, "/pause?mode=abort", {});
    const a = (await cut).json().choices[0];
    expect(a.finish_reason).toBe("abort");
    expect(a.token_ids.length).toBeGreaterThan(0);
    expect(a.token_ids.length).toBeLessThan(full.length);
    expect(full.slice(0, a.token_ids.length)).toEqual(a.token_ids);
    await post(app, "/resume", {});

    const kept = post(app, "/v1/chat/completions", { messages: MESSAGES, tools: TOOLS, return_token_ids: true });
    await sleep(4 * Math.floor(full.length / 2));
    await post(app, "/pause?mode=keep", {});
    await sleep(20);
    await post(app, "/resume", {});
    const k = (await kept).json().choices[0];
    expect(k.token_ids).toEqual(full);
    expect(k.finish_reason).toBe("tool_calls");
    expect(JSON.parse(k.message.tool_calls[0].function.arguments)).toEqual({ path: "a.txt", body: BODY });
  });
});
