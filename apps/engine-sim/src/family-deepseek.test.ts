import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim, getSimState } from "./app.js";
import type { Conversation } from "./__fixtures__/conversation.js";
import { playChat, playRaw, playTokenIn, post } from "./__fixtures__/conversation.js";

// DeepSeek-V3 (`--tool-call-parser deepseek_v3`, the tokenizer's own template) and DeepSeek-V3.1
// (`--tool-call-parser deepseek_v31 --reasoning-parser deepseek_v3`, a template from the V3.1 model
// card), both on the DeepSeek-V3 tokenizer; vllm/tool_parsers/deepseekv3_tool_parser.py,
// deepseekv31_tool_parser.py, vllm/reasoning/deepseek_v3_reasoning_parser.py (R1 when thinking).

const TOOLS = [{ type: "function", function: { name: "get_weather", description: "Get the weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const BOS = "<｜begin▁of▁sentence｜>";
const EOS = "<｜end▁of▁sentence｜>";

function conv(emittedCall: string): Conversation {
  return {
    messages: [
      { role: "system", content: 'You are a weather bot.\n#sim: [{"think":"Look it up.","tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]},{"think":"Report.","text":"It is sunny."}]' },
      { role: "user", content: "Weather in Paris?" },
    ],
    tools: TOOLS,
    results: ["Sunny, 21 C"],
    turns: [
      { emitted: emittedCall, content: null, reasoning: null, calls: [{ name: "get_weather", arguments: '{"city": "Paris"}' }], finish: "tool_calls" },
      { emitted: `It is sunny.${EOS}`, content: "It is sunny.", reasoning: null, calls: [], finish: "stop" },
    ],
  };
}

const apps: FastifyInstance[] = [];
let v3: FastifyInstance;
let v31: FastifyInstance;
let v31sglang: FastifyInstance;
beforeAll(() => {
  v3 = buildEngineSim({ family: "deepseek-v3" });
  v31 = buildEngineSim({ family: "deepseek-v3.1" });
  v31sglang = buildEngineSim({ family: "deepseek-v3.1", kind: "sglang" });
  apps.push(v3, v31, v31sglang);
});
afterAll(async () => {
  await Promise.all(apps.map((a) => a.close()));
});

describe("DeepSeek-V3", () => {
  it("renders with the tokenizer's own template (as shipped: a tool-call turn vLLM hands over with content '' loses its calls)", async () => {
    const tok = getSimState(v3).tok;
    expect(tok.modelVocabSize).toBe(129280);
    const r = await post(v3, "/tokenize", {
      messages: [
        { role: "system", content: "You are helpful." },
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Hello!" },
        { role: "user", content: "Weather?" },
        { role: "assistant", content: null, tool_calls: [{ id: "a", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
        { role: "tool", tool_call_id: "a", content: "Sunny" },
      ],
    });
    // The DeepSeek-V3 template shipped in tokenizer_config.json renders calls only for content None,
    // and vLLM turns a null content into "" before templating.
    expect(tok.decode(r.json().tokens)).toBe(
      `${BOS}You are helpful.<｜User｜>Hi<｜Assistant｜>Hello!${EOS}<｜User｜>Weather?<｜Assistant｜>${EOS}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>Sunny<｜tool▁output▁end｜><｜tool▁outputs▁end｜>`,
    );
  });

  const V3_CALL = `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n\`\`\`json\n{"city": "Paris"}\n\`\`\`<｜tool▁call▁end｜><｜tool▁calls▁end｜>${EOS}`;

  it("a scripted tool conversation, not streamed and streamed; raw-prompt routes play the same", async () => {
    const tok = getSimState(v3).tok;
    const records = await playChat(v3, tok, conv(V3_CALL), false);
    await playRaw(v3, records, "vllm");
    await playChat(v3, tok, conv(V3_CALL), true);
  });

  it("token-in on the chat route (kv_transfer_params, prompt_token_ids, SGLang input_ids) gives the same answers", async () => {
    await playTokenIn({ family: "deepseek-v3" }, conv(V3_CALL));
  });

  it("two calls are joined by a newline, as the V3 format writes them", async () => {
    const r = await post(v3, "/v1/chat/completions", {
      messages: [{ role: "user", content: '#sim: [{"text":"Both.","tool_calls":[{"name":"a","arguments":{"x":1}},{"name":"b","arguments":{}}]}]' }],
      tools: TOOLS,
      return_token_ids: true,
    });
    const j = r.json();
    expect(getSimState(v3).tok.decode(j.choices[0].token_ids)).toBe(
      `Both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n\`\`\`json\n{"x": 1}\n\`\`\`<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n\`\`\`json\n{}\n\`\`\`<｜tool▁call▁end｜><｜tool▁calls▁end｜>${EOS}`,
    );
    expect(j.choices[0].message.content).toBe("Both.");
    expect(j.choices[0].message.tool_calls.map((t: { function: unknown }) => t.function)).toEqual([
      { name: "a", arguments: '{"x": 1}' },
      { name: "b", arguments: "{}" },
    ]);
  });
});

describe("DeepSeek-V3.1", () => {
  it("has <think> and </think> as single tokens 128798/128799 (placeholders in V3's tokenizer)", () => {
    expect(getSimState(v31).tok.encode("<think></think>")).toEqual([128798, 128799]);
    expect(getSimState(v3).tok.encode("<think>").length).toBeGreaterThan(1);
  });

  it("renders the model card's formats: tool description in the system prompt, non-thinking and thinking prefixes", async () => {
    const tok = getSimState(v31).tok;
    const desc =
      '## Tools\nYou have access to the following tools:\n\n### get_weather\nDescription: Get the weather\n\nParameters: {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}\n\n' +
      "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n- For multiple tool calls, chain them directly without separators or spaces\n";
    // Model card, "Toolcall": <｜begin▁of▁sentence｜>{system prompt}\n\n{tool_description}<｜User｜>{query}<｜Assistant｜></think>
    const r = await post(v31, "/tokenize", { messages: [{ role: "system", content: "You are helpful." }, { role: "user", content: "Weather?" }], tools: TOOLS });
    expect(tok.decode(r.json().tokens)).toBe(`${BOS}You are helpful.\n\n${desc}<｜User｜>Weather?<｜Assistant｜></think>`);
    // Model card, multi-turn: earlier answers keep only what follows </think>; thinking mode opens with <think>.
    const t = await post(v31, "/tokenize", {
      messages: [
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Hello!" },
        { role: "user", content: "Why?" },
      ],
      chat_template_kwargs: { thinking: true },
    });
    expect(tok.decode(t.json().tokens)).toBe(`${BOS}<｜User｜>Hi<｜Assistant｜></think>Hello!${EOS}<｜User｜>Why?<｜Assistant｜><think>`);
    // A call turn and its result: the model answers on right after <｜tool▁output▁end｜>.
    const c = await post(v31, "/tokenize", {
      messages: [
        { role: "user", content: "Weather?" },
        { role: "assistant", content: null, tool_calls: [{ id: "a", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
        { role: "tool", tool_call_id: "a", content: "Sunny" },
      ],
    });
    expect(tok.decode(c.json().tokens)).toBe(
      `${BOS}<｜User｜>Weather?<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>${EOS}<｜tool▁output▁begin｜>Sunny<｜tool▁output▁end｜>`,
    );
  });

  const V31_CALL = `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>${EOS}`;

  it("a scripted tool conversation (non-thinking), not streamed and streamed; raw-prompt routes play the same; call turns round-trip", async () => {
    const tok = getSimState(v31).tok;
    const records = await playChat(v31, tok, conv(V31_CALL), false);
    await playRaw(v31, records, "vllm");
    await playRaw(v31sglang, records, "sglang");
    await playChat(v31, tok, conv(V31_CALL), true);
    const [a, b] = records;
    expect(b!.promptIds.slice(0, a!.promptIds.length + a!.ids.length)).toEqual([...a!.promptIds, ...a!.ids]);
  });

  it("token-in on the chat route (kv_transfer_params, prompt_token_ids, SGLang input_ids) gives the same answers", async () => {
    await playTokenIn({ family: "deepseek-v3.1" }, conv(V31_CALL));
  });

  it("thinking=true: the model reasons after the prompt's <think>; deepseek_v3 → R1 splits reasoning from content", async () => {
    const messages = [{ role: "user", content: '#sim: [{"think":"Paris is in France.","text":"France."}]\nWhere is Paris?' }];
    for (const stream of [false, true]) {
      const c: Conversation = {
        messages,
        results: [],
        extra: { chat_template_kwargs: { thinking: true } },
        turns: [{ emitted: `Paris is in France.</think>France.${EOS}`, content: "France.", reasoning: "Paris is in France.", calls: [], finish: "stop" }],
      };
      await playChat(v31, getSimState(v31).tok, c, stream);
    }
    // Without the switch the prompt ends with </think>: no reasoning is written.
    const j = (await post(v31, "/v1/chat/completions", { messages, return_token_ids: true })).json();
    expect(getSimState(v31).tok.decode(j.choices[0].token_ids)).toBe(`France.${EOS}`);
    expect(j.choices[0].message.reasoning).toBeNull();
  });
});
