import { describe, expect, it } from "vitest";
import { PRESETS, profileOf, templateFields } from "./index.js";

describe("templateFields", () => {
  it("Qwen3: the thinking switch goes under enable_thinking, other kwargs pass through", () => {
    expect(templateFields(PRESETS.qwen3!, { enable_thinking: false })).toEqual({ chat_template_kwargs: { enable_thinking: false } });
    expect(templateFields(PRESETS.qwen3!, { enable_thinking: true, chat_template_kwargs: { enable_thinking: true, foo: [1] } })).toEqual({
      chat_template_kwargs: { enable_thinking: true, foo: [1] },
    });
    expect(templateFields(PRESETS.qwen3!, {})).toEqual({});
  });

  it("DeepSeek-V3.1 reads `thinking`; a client's own `thinking` wins", () => {
    expect(templateFields(PRESETS["deepseek-v3.1"]!, { enable_thinking: true })).toEqual({ chat_template_kwargs: { thinking: true } });
    expect(templateFields(PRESETS["deepseek-v3.1"]!, { enable_thinking: true, chat_template_kwargs: { thinking: false } })).toEqual({
      chat_template_kwargs: { thinking: false },
    });
  });

  it("DeepSeek-V3.1 calls tools only in non-thinking mode: a client's thinking switch is off when the request declares tools", () => {
    const tools = [{ type: "function" as const, function: { name: "f", parameters: { type: "object" } } }];
    expect(templateFields(PRESETS["deepseek-v3.1"]!, { enable_thinking: true, tools })).toEqual({ chat_template_kwargs: { thinking: false } });
    expect(templateFields(PRESETS["deepseek-v3.1"]!, { enable_thinking: true, tools: [] })).toEqual({ chat_template_kwargs: { thinking: true } });
    // A client that sets the kwarg itself is taken at its word.
    expect(templateFields(PRESETS["deepseek-v3.1"]!, { enable_thinking: true, tools, chat_template_kwargs: { thinking: true } })).toEqual({ chat_template_kwargs: { thinking: true } });
    // Families that think beside their calls keep the switch.
    expect(templateFields(PRESETS.qwen3!, { enable_thinking: true, tools })).toEqual({ chat_template_kwargs: { enable_thinking: true } });
  });

  it("gpt-oss gets the client's reasoning_effort at the top level and no thinking kwarg", () => {
    expect(templateFields(PRESETS["gpt-oss"]!, { enable_thinking: true, reasoning_effort: "high" })).toEqual({ reasoning_effort: "high" });
    // Other families keep the effort to themselves (it became the thinking switch already).
    expect(templateFields(PRESETS.qwen3!, { enable_thinking: true, reasoning_effort: "high" })).toEqual({ chat_template_kwargs: { enable_thinking: true } });
  });

  it("a listed pass-through lets only those keys reach the engine", () => {
    const p = profileOf({ extends: "llama3", chat_template_kwargs: ["date_string"] });
    expect(templateFields(p, { chat_template_kwargs: { date_string: "26 Jul 2024", custom_tools: [] }, enable_thinking: true })).toEqual({
      chat_template_kwargs: { date_string: "26 Jul 2024" },
    });
  });
});
