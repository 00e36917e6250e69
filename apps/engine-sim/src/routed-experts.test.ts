import type { FastifyInstance } from "fastify";
import { afterAll, describe, expect, it } from "vitest";
import { buildEngineSim } from "./app.js";
import { IM_END_ID, getTokenizer } from "./index.js";
import { parseMoe, routeSequence } from "./moe.js";

// Wire format under test (README "Routed experts"): vLLM ≥ 0.21.0 with --enable-return-routed-experts
// (prompt_routed_experts + choices[].routed_experts, [tokens][layers][topk], non-streamed only);
// SGLang with --enable-return-routed-experts and return_routed_experts: true (base64 int32 of
// [seqlen - 1, layers, topk]: meta_info.routed_experts on /generate, choices[].sgl_ext on the OpenAI routes).

const tok = getTokenizer();
const MOE = parseMoe("3,8,2");
const HI = '#sim: [{"text":"Hi there"}]';
const OUT = [...tok.encode("Hi there"), IM_END_ID];
const apps: FastifyInstance[] = [];
afterAll(async () => {
  for (const a of apps) await a.close();
});

function sim(opts: Parameters<typeof buildEngineSim>[0]): FastifyInstance {
  const app = buildEngineSim(opts);
  apps.push(app);
  return app;
}

async function post(app: FastifyInstance, url: string, payload: object) {
  return app.inject({ method: "POST", url, payload: JSON.stringify(payload), headers: { "content-type": "application/json" } });
}

function unpack(b64: string): number[][] {
  const buf = Buffer.from(b64, "base64");
  const flat = Array.from({ length: buf.length / 4 }, (_, i) => buf.readInt32LE(i * 4));
  const w = MOE.layers * MOE.topk;
  return Array.from({ length: flat.length / w }, (_, i) => flat.slice(i * w, (i + 1) * w));
}

const nested = (rows: number[][][]) => rows.map((r) => r.flat());

describe("routing (moe.ts)", () => {
  it("is a deterministic function of weight version and context: top-k distinct experts per layer", () => {
    const seq = [5, 9, 2, 7];
    const a = routeSequence(MOE, seq, () => "0");
    expect(a).toEqual(routeSequence(MOE, seq, () => "0"));
    expect(a).toHaveLength(seq.length - 1);
    for (const row of a) {
      expect(row).toHaveLength(MOE.layers * MOE.topk);
      for (let l = 0; l < MOE.layers; l++) {
        const layer = row.slice(l * 2, l * 2 + 2);
        expect(new Set(layer).size).toBe(2);
        for (const e of layer) expect(e >= 0 && e < MOE.experts).toBe(true);
      }
    }
    // Another version routes differently; a different earlier token changes every later row (causal context).
    expect(routeSequence(MOE, seq, () => "1")).not.toEqual(a);
    const b = routeSequence(MOE, [6, 9, 2, 7], () => "0");
    expect(b[2]).not.toEqual(a[2]);
    expect(routeSequence(MOE, [5, 9, 2, 8], () => "0")).toEqual(a);
  });

  it("--moe is checked", () => {
    expect(() => parseMoe("3,8")).toThrow(/layers,experts,topk/);
    expect(() => parseMoe("3,2,4")).toThrow(/topk 4/);
  });
});

describe("vLLM --enable-return-routed-experts", () => {
  it("is refused before 0.21.0 and without a MoE model", () => {
    expect(() => buildEngineSim({ moe: MOE, returnRoutedExperts: true, vllmVersion: "0.20.2" })).toThrow(/0\.20\.2 has no --enable-return-routed-experts/);
    expect(() => buildEngineSim({ returnRoutedExperts: true })).toThrow(/--moe/);
  });

  it("chat: prompt_routed_experts per prompt token, choices[].routed_experts per generated token but the last", async () => {
    const app = sim({ moe: MOE, returnRoutedExperts: true });
    const res = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: HI }], return_token_ids: true });
    const j = res.json();
    const prompt: number[] = j.prompt_token_ids;
    expect(j.choices[0].token_ids).toEqual(OUT);
    const expected = routeSequence(MOE, [...prompt, ...OUT], () => "0");
    expect(j.prompt_routed_experts).toHaveLength(prompt.length);
    expect(j.prompt_routed_experts[0]).toHaveLength(MOE.layers);
    expect(j.prompt_routed_experts[0][0]).toHaveLength(MOE.topk);
    expect(nested(j.prompt_routed_experts)).toEqual(expected.slice(0, prompt.length));
    expect(nested(j.choices[0].routed_experts)).toEqual(expected.slice(prompt.length));
    expect(j.choices[0].routed_experts).toHaveLength(OUT.length - 1);

    // A second identical request hits the prefix cache: cached prompt positions are rows of -1.
    const again = (await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: HI }], return_token_ids: true })).json();
    const cached: number = again.usage.prompt_tokens_details.cached_tokens;
    expect(cached).toBeGreaterThan(0);
    expect(nested(again.prompt_routed_experts).slice(0, cached).every((r: number[]) => r.every((e) => e === -1))).toBe(true);
    expect(nested(again.prompt_routed_experts).slice(cached)).toEqual(expected.slice(cached, prompt.length));
  });

  it("streamed answers carry none (vLLM returns routing only on finished, non-streamed answers)", async () => {
    const app = sim({ moe: MOE, returnRoutedExperts: true });
    const res = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: HI }], stream: true });
    expect(res.body).not.toContain("routed_experts");
  });

  it("completions (token-in): the same fields", async () => {
    const app = sim({ moe: MOE, returnRoutedExperts: true });
    const prompt = tok.encode(HI);
    const j = (await post(app, "/v1/completions", { prompt, max_tokens: 16, return_token_ids: true })).json();
    const out: number[] = j.choices[0].token_ids;
    const expected = routeSequence(MOE, [...prompt, ...out], () => "0");
    expect(nested(j.prompt_routed_experts)).toEqual(expected.slice(0, prompt.length));
    expect(nested(j.choices[0].routed_experts)).toEqual(expected.slice(prompt.length));
  });

  it("a server without the flag sends no routing", async () => {
    const app = sim({ moe: MOE });
    const j = (await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: HI }] })).json();
    expect(j).not.toHaveProperty("prompt_routed_experts");
    expect(j.choices[0]).not.toHaveProperty("routed_experts");
  });
});

describe("SGLang --enable-return-routed-experts", () => {
  it("/generate: meta_info.routed_experts only when the request asks, [seqlen - 1] rows as base64 int32", async () => {
    const app = sim({ kind: "sglang", moe: MOE, returnRoutedExperts: true });
    const prompt = tok.encode(HI);
    const plain = (await post(app, "/generate", { input_ids: prompt })).json();
    expect(plain.meta_info).not.toHaveProperty("routed_experts");
    const j = (await post(app, "/generate", { input_ids: prompt, return_routed_experts: true })).json();
    expect(unpack(j.meta_info.routed_experts)).toEqual(routeSequence(MOE, [...prompt, ...j.output_ids], () => "default"));
  });

  it("/generate streamed: only the final event carries it", async () => {
    const app = sim({ kind: "sglang", moe: MOE, returnRoutedExperts: true });
    const prompt = tok.encode(HI);
    const res = await post(app, "/generate", { input_ids: prompt, return_routed_experts: true, stream: true });
    const events = res.body.split("\n\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)));
    expect(events.slice(0, -1).every((e) => e.meta_info.routed_experts === undefined)).toBe(true);
    const last = events.at(-1);
    expect(unpack(last.meta_info.routed_experts)).toEqual(routeSequence(MOE, [...prompt, ...last.output_ids], () => "default"));
  });

  it("chat, streamed and not: choices[].sgl_ext.routed_experts (on the finishing chunk when streamed)", async () => {
    const app = sim({ kind: "sglang", moe: MOE, returnRoutedExperts: true });
    const body = { messages: [{ role: "user", content: HI }], return_routed_experts: true, return_prompt_token_ids: true, return_token_ids: true };
    const j = (await post(app, "/v1/chat/completions", body)).json();
    const c = j.choices[0];
    const expected = routeSequence(MOE, [...c.prompt_token_ids, ...c.token_ids], () => "default");
    expect(unpack(c.sgl_ext.routed_experts)).toEqual(expected);
    const res = await post(app, "/v1/chat/completions", { messages: body.messages, return_routed_experts: true, stream: true });
    expect(res.statusCode).toBe(200);
    const chunks = res.body.split("\n\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)));
    const carrying = chunks.filter((ch) => ch.choices?.[0]?.sgl_ext);
    expect(carrying).toHaveLength(1);
    expect(carrying[0].choices[0].finish_reason).toBe("stop");
    expect(unpack(carrying[0].choices[0].sgl_ext.routed_experts)).toEqual(expected);
  });
});
