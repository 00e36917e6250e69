import { describe, expect, it } from "vitest";
import { loadGatewayEnv } from "./env.js";

describe("gateway environment", () => {
  it("fills the documented defaults", () => {
    const env = loadGatewayEnv({ ROLLGATE_ENGINES: '[{"kind":"vllm","url":"http://e:8000/"}]' });
    expect(env).toMatchObject({ PORT: 8080, REDIS_URL: "redis://127.0.0.1:6379", ROLLGATE_KEY_PREFIX: "rg", LOG_LEVEL: "info", ROLLGATE_ROUTING: "least_loaded" });
    expect(env.ROLLGATE_ENGINES).toEqual([{ kind: "vllm", url: "http://e:8000", dp_size: 1 }]);
    // The workers' default too: what the gateway ends itself is kept as long as their results.
    expect(env.ROLLGATE_RESULT_TTL_S).toBe(7 * 24 * 3600);
    expect(loadGatewayEnv({ ROLLGATE_ENGINES: '[{"kind":"vllm","url":"http://e:8000/"}]', ROLLGATE_RESULT_TTL_S: "86400" }).ROLLGATE_RESULT_TTL_S).toBe(86_400);
  });

  it("stops on a bad value with a message naming every bad variable, never a silent default", () => {
    expect(() => loadGatewayEnv({ PORT: "eighty", ROLLGATE_ENGINES: "[" })).toThrow(/PORT[\s\S]*ROLLGATE_ENGINES: must be a JSON list/);
    expect(() => loadGatewayEnv({ ROLLGATE_ENGINES: '[{"kind":"tgi","url":"http://e"}]' })).toThrow(/ROLLGATE_ENGINES\.0\.kind/);
    expect(() => loadGatewayEnv({})).toThrow(/ROLLGATE_ENGINES/);
    for (const bad of ["0", "-5", "1.5", "a week"]) {
      expect(() => loadGatewayEnv({ PORT: "eighty", ROLLGATE_RESULT_TTL_S: bad, ROLLGATE_ENGINES: "[" })).toThrow(/PORT[\s\S]*ROLLGATE_ENGINES[\s\S]*ROLLGATE_RESULT_TTL_S/);
    }
  });
});

const engines = (list: unknown[]) => ({ ROLLGATE_ENGINES: JSON.stringify(list) });

describe("gateway environment: model profiles", () => {
  it("takes a preset name, an inline profile, a vocab_size, or nothing", () => {
    const env = loadGatewayEnv(
      engines([
        { kind: "vllm", url: "http://a:8000", profile: "llama3" },
        { kind: "sglang", url: "http://b:30000", profile: { extends: "qwen3", thinking: { forward_reasoning_effort: true } }, vocab_size: 152_064 },
        { kind: "vllm", url: "http://c:8000" },
      ]),
    );
    expect(env.ROLLGATE_ENGINES.map((e) => e.profile ?? null)).toEqual(["llama3", { extends: "qwen3", thinking: { forward_reasoning_effort: true } }, null]);
    expect(env.ROLLGATE_ENGINES[1]!.vocab_size).toBe(152_064);
  });

  it("names each bad profile by engine, with the presets, together with every other bad variable", () => {
    let message = "";
    try {
      loadGatewayEnv({
        PORT: "eighty",
        ...engines([
          { kind: "vllm", url: "http://a:8000", profile: "qwen4" },
          { kind: "vllm", url: "http://b:8000", profile: { token_in: "sometimes" } },
        ]),
      });
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/^invalid environment:/);
    expect(message).toMatch(/PORT/);
    expect(message).toMatch(/ROLLGATE_ENGINES\.0\.profile: unknown profile "qwen4" \(presets: .*llama3/);
    expect(message).toMatch(/ROLLGATE_ENGINES\.1\.profile: token_in/);
    expect(() => loadGatewayEnv(engines([{ kind: "vllm", url: "http://a:8000", vocab_size: 0 }]))).toThrow(/ROLLGATE_ENGINES\.0\.vocab_size/);
  });
});
