import { describe, expect, it } from "vitest";
import { Template } from "@huggingface/jinja";
import { PyDict, parsePyJson, pyDumps, pyFloatRepr } from "@rollgate/pyjson";
import { ChatRenderError } from "./template.js";
import { renderChat } from "./index.js";

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the weather",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};

describe("Python json.dumps fidelity (transformers' tojson = json.dumps(ensure_ascii=False))", () => {
  it("@huggingface/jinja's tojson uses ', ' and ': ' separators and keeps non-ASCII", () => {
    const out = new Template("{{ x | tojson }}").render({ x: { a: 1, b: [1, 2], c: "日本é" } });
    expect(out).toBe('{"a": 1, "b": [1, 2], "c": "日本é"}');
  });

  it("but it loses floats like 1.0, which pyDumps keeps (json.dumps(1.0) == '1.0')", () => {
    expect(new Template("{{ x | tojson }}").render({ x: JSON.parse('{"a": 1.0}') })).toBe('{"a": 1}');
    expect(pyDumps(parsePyJson('{"a": 1.0, "b": [1, 2.5e-7], "c": "日本", "d": null, "e": true}'))).toBe(
      '{"a": 1.0, "b": [1, 2.5e-07], "c": "日本", "d": null, "e": true}',
    );
  });

  it("pyDumps keeps key order (even integer-like keys), escapes like Python", () => {
    const v = parsePyJson('{"b": 1, "2": 2, "q": "a\\"b\\n\\u0001/"}');
    expect(pyDumps(v)).toBe('{"b": 1, "2": 2, "q": "a\\"b\\n\\u0001/"}');
    expect(v).toBeInstanceOf(PyDict);
  });

  it("pyFloatRepr matches Python repr()", () => {
    const cases: [number, string][] = [
      [1, "1.0"], [1.5, "1.5"], [100, "100.0"], [0.0001, "0.0001"], [0.00001, "1e-05"],
      [1e16, "1e+16"], [1e15, "1000000000000000.0"], [123.456, "123.456"], [-2.5, "-2.5"], [1.5e300, "1.5e+300"], [0.1 + 0.2, "0.30000000000000004"],
    ];
    for (const [x, s] of cases) expect(pyFloatRepr(x)).toBe(s);
  });
});

describe("Qwen3 chat template rendered as vLLM does", () => {
  it("system + user + tools (tools as ChatCompletionToolsParam.model_dump())", () => {
    const out = renderChat({
      messages: [
        { role: "system", content: "You are helpful." },
        { role: "user", content: "Weather in Paris?" },
      ],
      tools: [parsePyJson('{"function": {"parameters": {"type": "object", "properties": {"n": {"type": "number", "minimum": 1.0}}}, "name": "f"}, "type": "function"}')],
    });
    expect(out).toBe(
      "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
        // declared fields first (type, function{name, description=null, parameters}), floats kept
        '{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object", "properties": {"n": {"type": "number", "minimum": 1.0}}}}}' +
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n",
    );
  });

  it("assistant with reasoning + tool call echoed back, then a tool result (arguments string → dict → tojson)", () => {
    const out = renderChat({
      messages: [
        { role: "user", content: [{ type: "text", text: "Weather" }, { type: "text", text: "in Paris?" }] },
        {
          role: "assistant",
          content: null,
          reasoning: "\nI should check.\n",
          tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris","x":1.0}' } }],
        },
        { role: "tool", tool_call_id: "c1", content: "sunny" },
      ],
      tools: [parsePyJson(JSON.stringify(weatherTool))],
    });
    expect(out.endsWith(
      "<|im_start|>user\nWeather\nin Paris?<|im_end|>\n" +
        '<|im_start|>assistant\n<think>\nI should check.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "x": 1.0}}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )).toBe(true);
  });

  it("reasoning_content is accepted as the input field too; enable_thinking=false adds the empty think block", () => {
    const out = renderChat({
      messages: [
        { role: "user", content: "hi" },
        { role: "assistant", content: "hello", reasoning_content: "greet" },
        { role: "user", content: "again" },
      ],
      chatTemplateKwargs: { enable_thinking: false },
    });
    // Earlier turns drop their reasoning (Qwen3 template), the generation prompt gets <think>\n\n</think>\n\n.
    expect(out).toBe(
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    );
  });

  it("continue_final_message cuts after the final message; both flags at once is an error", () => {
    const out = renderChat({
      messages: [
        { role: "user", content: "hi" },
        { role: "assistant", content: "Hel" },
      ],
      addGenerationPrompt: false,
      continueFinalMessage: true,
    });
    expect(out).toBe("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHel");
    expect(() => renderChat({ messages: [{ role: "user", content: "x" }], continueFinalMessage: true })).toThrow(ChatRenderError);
  });
});
