/**
 * Preflight through `GET /admin/engines`, against engine-sim serving several families: what each
 * engine reports before a run is what the rest of the suite shows happening in runs.
 */
import { Preflight } from "@rollgate/protocol";
import { describe, expect, it } from "vitest";
import { startHarness } from "./__fixtures__/harness.js";

async function preflightOf(family: string, sim: Record<string, unknown> = {}): Promise<{ profile: string; preflight: Preflight }> {
  const h = await startHarness(`preflight-${family.replace(".", "")}`, { family: family as never, startDate: "2026-01-05", ...sim });
  try {
    const res = await fetch(`${h.url}/admin/engines`);
    expect(res.status).toBe(200);
    const body = (await res.json()) as { engines: { profile: string; preflight: unknown }[] };
    // The report is the documented shape.
    return { profile: body.engines[0]!.profile, preflight: Preflight.parse(body.engines[0]!.preflight) };
  } finally {
    await h.close();
  }
}

describe("preflight per engine (GET /admin/engines)", () => {
  it("Qwen3 on vLLM 0.28: token-in on the chat route, tool turns round-trip, reasoning dropped at new user turns, keep pauses", async () => {
    const e = await preflightOf("qwen3");
    expect(e.profile).toBe("qwen3");
    expect(e.preflight).toMatchObject({
      profile: "qwen3",
      served_model: "Qwen/Qwen3-8B",
      version: "0.28.0",
      vocab_size: 151_936,
      token_in: { available: true, route: "chat_kv_transfer_params", end_of_turn: "<|im_end|>", why: null },
      tool_turn: { round_trips: true },
      reasoning: { dropped_at_user_turn: true, dropped_in_tool_loop: false },
      pause: { abort_mode: "keep" },
      errors: [],
    });
  });

  it("Llama 3.1: its own end-of-turn token, derived from its renders; a template that never renders reasoning", async () => {
    const e = await preflightOf("llama3.1");
    expect(e.preflight).toMatchObject({
      profile: "llama3",
      vocab_size: 128_256,
      token_in: { available: true, end_of_turn: "<|eot_id|>" },
      tool_turn: { round_trips: true, form: "as_generated" },
      reasoning: { dropped_at_user_turn: true, dropped_in_tool_loop: true, detail: expect.stringMatching(/never renders earlier reasoning/) },
    });
  });

  it("DeepSeek-V3: its shipped template re-renders a tool-calling turn without the calls, and says where", async () => {
    const e = await preflightOf("deepseek-v3");
    expect(e.preflight.token_in).toMatchObject({ available: true, end_of_turn: "<｜end▁of▁sentence｜>" });
    expect(e.preflight.tool_turn).toMatchObject({ round_trips: false, form: null, detail: expect.stringMatching(/^the turn re-renders differently at token 0 of the turn: generated "<｜tool▁calls▁begin｜>/) });
  });

  it("gpt-oss: no token-in (harmony renders outside the template), and its tool turns do not round-trip", async () => {
    const e = await preflightOf("gpt-oss");
    expect(e.preflight).toMatchObject({
      vocab_size: 201_088,
      token_in: { available: false, route: null, why: "the gpt-oss profile turns token-in off" },
      tool_turn: { round_trips: false },
      pause: { abort_mode: "keep" },
    });
  });

  it("SGLang: in-place pauses, every call read from its chat stream (it carries the ids) by SGLang's own parsers", async () => {
    const e = await preflightOf("llama3.1", { kind: "sglang" });
    expect(e.preflight).toMatchObject({
      kind: "sglang",
      token_in: { available: true, route: "chat_input_ids", end_of_turn: "<|eot_id|>" },
      pause: { abort_mode: "in_place", why: expect.stringMatching(/its own llama3 parser reads them/) },
    });
  });

  it("an older vLLM: no chat token-in and no keep pauses; Qwen3 falls back on its gateway parser, Llama has neither", async () => {
    const qwen = await preflightOf("qwen3", { vllmVersion: "0.15.1" });
    expect(qwen.preflight).toMatchObject({ version: "0.15.1", token_in: { available: true, route: "completions" }, pause: { abort_mode: "abort_continue" } });
    const llama = await preflightOf("llama3.1", { vllmVersion: "0.15.1" });
    expect(llama.preflight).toMatchObject({
      token_in: { available: false, why: expect.stringMatching(/takes no pre-tokenised prompt and the llama3 profile declares no gateway parser/) },
      pause: { abort_mode: "drain", why: expect.stringMatching(/in-flight calls finish on the old weights/) },
    });
  });
});
