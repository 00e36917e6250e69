import { describe, expect, it } from "vitest";
import { ModelProfile, PRESETS, PRESET_NAMES, resolveProfile } from "./index.js";

describe("presets", () => {
  it("has the families the gateway knows, each a valid profile named by its key", () => {
    expect([...PRESET_NAMES].sort()).toEqual(["deepseek-v3", "deepseek-v3.1", "default", "glm-4.5", "gpt-oss", "kimi-k2", "llama3", "mistral", "qwen2.5", "qwen3", "qwen3-coder"]);
    for (const [name, p] of Object.entries(PRESETS)) {
      expect(ModelProfile.parse(p)).toEqual(p);
      expect(p.name).toBe(name);
    }
  });

  it("default is conservative: no bound, no gateway parser, no token-in, nothing normalised", () => {
    expect(PRESETS.default).toMatchObject({ vocab_size: null, gateway_parser: null, token_in: "off", history_normalization: "none", chat_template_kwargs: "all" });
  });

  it("bounds the vocabularies the issue names: Kimi-K2 and gpt-oss above Qwen3's 151,936", () => {
    expect(PRESETS.qwen3!.vocab_size).toBe(151_936);
    expect(PRESETS["kimi-k2"]!.vocab_size).toBe(163_840);
    expect(PRESETS["gpt-oss"]!.vocab_size).toBe(201_088);
    expect(PRESETS.llama3!.vocab_size).toBe(128_256);
  });

  it("declares a gateway parser only for the hermes-format families, and switches thinking per family", () => {
    const parsers = Object.fromEntries(Object.values(PRESETS).map((p) => [p.name, p.gateway_parser]));
    expect(Object.entries(parsers).filter(([, v]) => v !== null)).toEqual([
      ["qwen3", "qwen3"],
      ["qwen2.5", "hermes"],
    ]);
    expect(PRESETS["qwen3-coder"]!.gateway_parser).toBeNull();
    expect(PRESETS["deepseek-v3.1"]!.thinking.kwarg).toBe("thinking");
    expect(PRESETS["deepseek-v3"]!.thinking.kwarg).toBeNull();
    expect(PRESETS["gpt-oss"]!.thinking).toEqual({ kwarg: null, forward_reasoning_effort: true });
    expect(PRESETS["gpt-oss"]!.token_in).toBe("off");
  });
});

describe("resolveProfile", () => {
  it("absent → default; a name → that preset; vocab_size overrides the preset's", () => {
    expect(resolveProfile(undefined)).toEqual({ ok: true, profile: PRESETS.default });
    expect(resolveProfile("llama3")).toEqual({ ok: true, profile: PRESETS.llama3 });
    const r = resolveProfile("qwen3", 152_064);
    expect(r.ok && r.profile.vocab_size).toBe(152_064);
    expect(r.ok && r.profile.gateway_parser).toBe("qwen3");
  });

  it("an inline profile extends a preset field by field", () => {
    const r = resolveProfile({ extends: "qwen3", name: "my-qwen", thinking: { forward_reasoning_effort: true }, notes: { reasoning_dropped: "mine" } });
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.profile.name).toBe("my-qwen");
    expect(r.profile.thinking).toEqual({ kwarg: "enable_thinking", forward_reasoning_effort: true });
    expect(r.profile.notes).toEqual({ reasoning_dropped: "mine", generation_prompt_dropped: PRESETS.qwen3!.notes.generation_prompt_dropped, rerendered: null });
    expect(r.profile.engine_parsers).toEqual(PRESETS.qwen3!.engine_parsers);
  });

  it("an inline profile without extends starts from default", () => {
    const r = resolveProfile({ vocab_size: 1000, engine_parsers: { sglang: { tool_call_parser: "x" } } });
    expect(r.ok && r.profile).toMatchObject({ name: "default+inline", vocab_size: 1000, token_in: "off", engine_parsers: { sglang: { tool_call_parser: "x", reasoning_parser: null } } });
  });

  it("lists every problem: unknown names (with the presets), bad fields, unknown keys", () => {
    const unknown = resolveProfile("qwen4");
    expect(unknown.ok).toBe(false);
    expect(!unknown.ok && unknown.issues[0]).toMatch(/unknown profile "qwen4" \(presets: default, qwen3, .*gpt-oss/);
    expect(resolveProfile({ extends: "nope" })).toMatchObject({ ok: false, issues: [expect.stringMatching(/^extends: unknown profile "nope"/)] });
    const bad = resolveProfile({ vocab_size: -1, token_in: "sometimes", colour: "red" });
    expect(bad.ok).toBe(false);
    if (bad.ok) return;
    expect(bad.issues.join("\n")).toMatch(/vocab_size/);
    expect(bad.issues.join("\n")).toMatch(/token_in/);
    expect(bad.issues.join("\n")).toMatch(/colour/);
    expect(resolveProfile({ gateway_parser: "llama3_json" })).toMatchObject({ ok: false });
  });
});
