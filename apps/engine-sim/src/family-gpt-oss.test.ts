import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim, getSimState } from "./app.js";
import type { Conversation } from "./__fixtures__/conversation.js";
import { playChat, playRaw, playTokenIn, post } from "./__fixtures__/conversation.js";

// gpt-oss as served by `vllm serve openai/gpt-oss-20b --tool-call-parser openai --reasoning-parser
// openai_gptoss`: the harmony format (OpenAI's "harmony response format" guide), parsed from the
// token stream by channel, on the o200k_harmony tokenizer (config vocab_size 201,088).

const TOOLS = [
  { type: "function", function: { name: "get_location", description: "Gets the location of the user.", parameters: { type: "object", properties: {} } } },
  {
    type: "function",
    function: {
      name: "get_current_weather",
      description: "Gets the current weather in the provided location.",
      parameters: {
        type: "object",
        properties: { location: { type: "string", description: "The city and state, e.g. San Francisco, CA" }, format: { type: "string", enum: ["celsius", "fahrenheit"], default: "celsius" } },
        required: ["location"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "get_multiple_weathers",
      description: "Gets the current weather in the provided list of locations.",
      parameters: {
        type: "object",
        properties: {
          locations: { type: "array", items: { type: "string" }, description: 'List of city and state, e.g. ["San Francisco, CA", "New York, NY"]' },
          format: { type: "string", enum: ["celsius", "fahrenheit"], default: "celsius" },
        },
        required: ["locations"],
      },
    },
  },
];

// The system and developer messages of the harmony guide's function-calling example.
const SYSTEM_HIGH =
  "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>";
const DEVELOPER =
  "<|start|>developer<|message|># Instructions\n\nAlways respond in riddles\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n" +
  "// Gets the location of the user.\ntype get_location = () => any;\n\n" +
  '// Gets the current weather in the provided location.\ntype get_current_weather = (_: {\n// The city and state, e.g. San Francisco, CA\nlocation: string,\nformat?: "celsius" | "fahrenheit", // default: celsius\n}) => any;\n\n' +
  '// Gets the current weather in the provided list of locations.\ntype get_multiple_weathers = (_: {\n// List of city and state, e.g. ["San Francisco, CA", "New York, NY"]\nlocations: string[],\nformat?: "celsius" | "fahrenheit", // default: celsius\n}) => any;\n\n' +
  "} // namespace functions<|end|>";

const SCRIPT = '#sim: [{"think":"Need the weather.","tool_calls":[{"name":"get_current_weather","arguments":{"location":"San Francisco"}}]},{"think":"Report it.","text":"It is sunny."}]';

const CONV: Conversation = {
  messages: [
    { role: "system", content: "Always respond in riddles" },
    { role: "user", content: `What is the weather like in SF?\n${SCRIPT}` },
  ],
  tools: TOOLS,
  results: ['{"sunny": true, "temperature": 20}'],
  turns: [
    {
      emitted: '<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>',
      content: null,
      reasoning: "Need the weather.",
      calls: [{ name: "get_current_weather", arguments: '{"location":"San Francisco"}' }],
      finish: "tool_calls",
    },
    {
      emitted: "<|channel|>analysis<|message|>Report it.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>",
      content: "It is sunny.",
      reasoning: "Report it.",
      calls: [],
      finish: "stop",
    },
  ],
  extra: { reasoning_effort: "high" },
};

let app: FastifyInstance;
let sglang: FastifyInstance;
beforeAll(() => {
  app = buildEngineSim({ family: "gpt-oss", startDate: "2025-06-28" });
  sglang = buildEngineSim({ family: "gpt-oss", kind: "sglang", startDate: "2025-06-28" });
});
afterAll(async () => {
  await app.close();
  await sglang.close();
});

describe("gpt-oss tokenizer and template (bundled: templates/gpt-oss.jinja)", () => {
  it("ids up to 201,087 are in vocabulary (the tokenizer's 200,019 plus the model's reserved rows)", async () => {
    const tok = getSimState(app).tok;
    expect(tok.encode("<|start|>assistant<|channel|>final<|message|>")[0]).toBe(200006);
    expect(tok.isValidId(201087)).toBe(true);
    expect(tok.isValidId(201088)).toBe(false);
    const ok = await post(app, "/v1/completions", { prompt: [200006, 201087], max_tokens: 1, return_token_ids: true });
    expect(ok.statusCode).toBe(200);
    const bad = await post(app, "/v1/completions", { prompt: [200006, 201088], max_tokens: 1 });
    expect(bad.json().error.message).toBe("Token id 201088 is out of vocabulary");
    expect((await post(app, "/detokenize", { tokens: [200006, 173781] })).json()).toEqual({ prompt: "<|start|>assistant" });
    const stats = (await app.inject({ method: "GET", url: "/sim/stats" })).json();
    expect(stats).toMatchObject({ family: "gpt-oss", model: "openai/gpt-oss-20b", vocab_size: 201088, tool_call_parser: "openai", reasoning_parser: "openai_gptoss", vllm_version: "0.28.0" });
  });

  it("renders the harmony guide's function-calling prompt: system (date, reasoning effort), developer (instructions, tools)", async () => {
    const r = await post(app, "/v1/chat/completions", { messages: [{ role: "system", content: "Always respond in riddles" }, { role: "user", content: "What is the weather like in SF?" }], tools: TOOLS, reasoning_effort: "high", max_tokens: 1, return_token_ids: true });
    const text = getSimState(app).tok.decode(r.json().prompt_token_ids);
    expect(text).toBe(`${SYSTEM_HIGH}${DEVELOPER}<|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant`);
  });

  it("reasoning_effort defaults to medium and must be low, medium or high", async () => {
    const r = await post(app, "/tokenize", { messages: [{ role: "user", content: "Hi" }] });
    expect(getSimState(app).tok.decode(r.json().tokens)).toBe(
      "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant",
    );
    const bad = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: "Hi" }], reasoning_effort: "extreme" });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error.message).toMatch(/reasoning_effort='extreme' is not supported by Harmony/);
  });

  it("renders a past call as vLLM writes it back (to= before the channel, `json` content type), the result from functions.NAME", async () => {
    const messages = [
      { role: "user", content: "Weather?" },
      { role: "assistant", content: null, reasoning: "Need it.", tool_calls: [{ id: "c1", type: "function", function: { name: "get_current_weather", arguments: '{"location":"SF"}' } }] },
      { role: "tool", tool_call_id: "c1", content: '{"sunny": true}' },
      { role: "assistant", content: "Sunny.", reasoning: "Report." },
      { role: "user", content: "Thanks" },
    ];
    const r = await post(app, "/tokenize", { messages });
    const text = getSimState(app).tok.decode(r.json().tokens);
    // Reasoning before the last final answer is dropped (vLLM's auto_drop_analysis_messages).
    expect(text.slice(text.indexOf("<|start|>user"))).toBe(
      '<|start|>user<|message|>Weather?<|end|><|start|>assistant to=functions.get_current_weather<|channel|>commentary json<|message|>{"location":"SF"}<|call|>' +
        '<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>{"sunny": true}<|end|>' +
        "<|start|>assistant<|channel|>analysis<|message|>Report.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.<|end|>" +
        "<|start|>user<|message|>Thanks<|end|><|start|>assistant",
    );
  });
});

describe("gpt-oss: a scripted tool conversation", () => {
  it("token-in on the chat route (kv_transfer_params, prompt_token_ids, SGLang input_ids) gives the same answers", async () => {
    await playTokenIn({ family: "gpt-oss", startDate: "2025-06-28" }, CONV);
  });

  it("chat route, not streamed: channels parsed into reasoning, tool call and content; <|call|> stops with its id", async () => {
    const records = await playChat(app, getSimState(app).tok, CONV, false);
    await playRaw(app, records, "vllm");
    await playRaw(sglang, records, "sglang");
    const j = (await post(app, "/v1/chat/completions", { messages: CONV.messages, tools: TOOLS })).json();
    expect(j.choices[0].stop_reason).toBe(200012);
  });

  it("chat route, streamed", async () => {
    await playChat(app, getSimState(app).tok, CONV, true);
  });

  it("a preamble before the call is content; more than one call per answer is refused", async () => {
    const r = await post(app, "/v1/chat/completions", {
      messages: [{ role: "user", content: '#sim: [{"text":"Checking.","tool_calls":[{"name":"get_location","arguments":{}}]}]' }],
      tools: TOOLS,
      return_token_ids: true,
    });
    const c = r.json().choices[0];
    expect(getSimState(app).tok.decode(c.token_ids)).toBe("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_location <|constrain|>json<|message|>{}<|call|>");
    expect(c.message.content).toBe("Checking.");
    expect(c.message.tool_calls[0].function).toEqual({ name: "get_location", arguments: "{}" });
    const two = await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: '#sim: [{"tool_calls":[{"name":"a","arguments":{}},{"name":"b","arguments":{}}]}]' }], tools: TOOLS });
    expect(two.statusCode).toBe(400);
    expect(two.json().error.message).toMatch(/gpt-oss: an answer makes one tool call/);
  });

  it("an unscripted answer is a final-channel message ended by <|return|>", async () => {
    const j = (await post(app, "/v1/chat/completions", { messages: [{ role: "user", content: "Hi" }], return_token_ids: true })).json();
    const text = getSimState(app).tok.decode(j.choices[0].token_ids);
    expect(text).toMatch(/^<\|channel\|>final<\|message\|>.+<\|return\|>$/);
    expect(j.choices[0].message.content).toBe(text.slice("<|channel|>final<|message|>".length, -"<|return|>".length));
    expect(j.choices[0].stop_reason).toBeNull();
  });
});
