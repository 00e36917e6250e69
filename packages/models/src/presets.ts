import type { ModelProfile } from "./profile.js";

/**
 * The presets: one per model family rollgate knows. Facts come from each family's published chat
 * template and output format and from vLLM's and SGLang's parser registries (the parser names).
 * Vocabulary sizes are the model's embedding rows (the largest of the family where sizes differ),
 * a bound every id the engine returns must respect.
 */

const CHATML_TOOL_RESPONSE: [string, string][] = [["<tool_response>", "</tool_response>"]];
const NO_NOTES = { reasoning_dropped: null, generation_prompt_dropped: null, rerendered: null };

/** The conservative profile for any model rollgate has no preset for. */
const DEFAULT: ModelProfile = {
  name: "default",
  description: "any model: the engine renders and parses, nothing is normalised, no gateway-side token-in, ids only checked to be non-negative integers",
  vocab_size: null,
  // Jinja templates ignore variables they do not read: passing a client's thinking switch costs nothing.
  thinking: { kwarg: "enable_thinking", forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "none",
  token_in: "off",
  gateway_parser: null,
  tool_result_wrappers: [],
  reasoning_end: null,
  engine_parsers: { vllm: { tool_call_parser: null, reasoning_parser: null }, sglang: { tool_call_parser: null, reasoning_parser: null } },
  notes: NO_NOTES,
};

const QWEN3: ModelProfile = {
  name: "qwen3",
  description: "Qwen3 hybrid-thinking models (<think> reasoning, hermes <tool_call> JSON, ChatML)",
  vocab_size: 151_936,
  thinking: { kwarg: "enable_thinking", forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  token_in: "auto",
  gateway_parser: "qwen3",
  tool_result_wrappers: CHATML_TOOL_RESPONSE,
  reasoning_end: "</think>",
  engine_parsers: {
    vllm: { tool_call_parser: "hermes", reasoning_parser: "qwen3" },
    sglang: { tool_call_parser: "qwen25", reasoning_parser: "qwen3" },
  },
  notes: {
    reasoning_dropped: "Qwen3's template leaves out the reasoning of assistant turns before the last user query",
    generation_prompt_dropped: "with thinking off, Qwen3's template renders earlier turns without the empty <think></think> block of their generation prompt",
    rerendered: null,
  },
};

const QWEN3_CODER: ModelProfile = {
  name: "qwen3-coder",
  description: "Qwen3-Coder (XML <tool_call><function=…><parameter=…> calls, ChatML, no thinking)",
  vocab_size: 151_936,
  thinking: { kwarg: null, forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  token_in: "auto",
  // Its calls are XML, not hermes JSON: the gateway's parsers would drop them, so the engine parses.
  gateway_parser: null,
  tool_result_wrappers: CHATML_TOOL_RESPONSE,
  reasoning_end: null,
  engine_parsers: {
    vllm: { tool_call_parser: "qwen3_coder", reasoning_parser: null },
    sglang: { tool_call_parser: "qwen3_coder", reasoning_parser: null },
  },
  notes: NO_NOTES,
};

const QWEN25: ModelProfile = {
  name: "qwen2.5",
  description: "Qwen2.5 instruct models (hermes <tool_call> JSON, ChatML, no thinking)",
  vocab_size: 152_064,
  thinking: { kwarg: null, forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  token_in: "auto",
  gateway_parser: "hermes",
  tool_result_wrappers: CHATML_TOOL_RESPONSE,
  reasoning_end: null,
  engine_parsers: {
    vllm: { tool_call_parser: "hermes", reasoning_parser: null },
    sglang: { tool_call_parser: "qwen25", reasoning_parser: null },
  },
  notes: NO_NOTES,
};

const LLAMA3: ModelProfile = {
  name: "llama3",
  description: "Llama 3.1 / 3.3 instruct (JSON tool calls, <|eot_id|> turns)",
  vocab_size: 128_256,
  thinking: { kwarg: null, forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  token_in: "auto",
  tool_calls_per_turn: 1,
  gateway_parser: null,
  tool_result_wrappers: [],
  reasoning_end: null,
  engine_parsers: {
    vllm: { tool_call_parser: "llama3_json", reasoning_parser: null },
    sglang: { tool_call_parser: "llama3", reasoning_parser: null },
  },
  notes: NO_NOTES,
};

const DEEPSEEK_V3: ModelProfile = {
  name: "deepseek-v3",
  description: "DeepSeek-V3 (<｜tool▁calls▁begin｜> calls with ```json arguments, no thinking switch)",
  vocab_size: 129_280,
  thinking: { kwarg: null, forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  token_in: "auto",
  gateway_parser: null,
  tool_result_wrappers: [],
  reasoning_end: null,
  engine_parsers: {
    vllm: { tool_call_parser: "deepseek_v3", reasoning_parser: null },
    sglang: { tool_call_parser: "deepseekv3", reasoning_parser: null },
  },
  notes: NO_NOTES,
};

const DEEPSEEK_V31: ModelProfile = {
  name: "deepseek-v3.1",
  description: "DeepSeek-V3.1 (<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS calls; thinking switched by the `thinking` kwarg, off when tools are declared)",
  vocab_size: 129_280,
  // V3.1 calls tools in non-thinking mode only: with thinking on, a turn after a tool result opens no
  // <think>, so the reasoning parser takes the whole answer, tool call included, for reasoning.
  thinking: { kwarg: "thinking", forward_reasoning_effort: false, off_with_tools: true },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  token_in: "auto",
  gateway_parser: null,
  tool_result_wrappers: [],
  reasoning_end: "</think>",
  engine_parsers: {
    vllm: { tool_call_parser: "deepseek_v31", reasoning_parser: "deepseek_v3" },
    sglang: { tool_call_parser: "deepseekv31", reasoning_parser: "deepseek-v3" },
  },
  notes: {
    reasoning_dropped: "DeepSeek-V3.1's template renders earlier assistant turns without their reasoning",
    generation_prompt_dropped: null,
    rerendered: null,
  },
};

const GLM45: ModelProfile = {
  name: "glm-4.5",
  description: "GLM-4.5 / 4.6 (<tool_call> with <arg_key>/<arg_value>, <think> reasoning, <|observation|> turns)",
  vocab_size: 151_552,
  thinking: { kwarg: "enable_thinking", forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  token_in: "auto",
  gateway_parser: null,
  tool_result_wrappers: [],
  reasoning_end: "</think>",
  engine_parsers: {
    vllm: { tool_call_parser: "glm45", reasoning_parser: "glm45" },
    sglang: { tool_call_parser: "glm45", reasoning_parser: "glm45" },
  },
  notes: {
    reasoning_dropped: "GLM-4.5's template leaves out the reasoning of assistant turns before the last user query",
    generation_prompt_dropped: null,
    rerendered: null,
  },
};

const KIMI_K2: ModelProfile = {
  name: "kimi-k2",
  description: "Kimi-K2 (<|tool_calls_section_begin|> calls with rendered call ids, 163,840-token vocabulary)",
  vocab_size: 163_840,
  thinking: { kwarg: "thinking", forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  token_in: "auto",
  gateway_parser: null,
  tool_result_wrappers: [],
  reasoning_end: "</think>",
  engine_parsers: {
    vllm: { tool_call_parser: "kimi_k2", reasoning_parser: "kimi_k2" },
    sglang: { tool_call_parser: "kimi_k2", reasoning_parser: "kimi_k2" },
  },
  notes: NO_NOTES,
};

const GPT_OSS: ModelProfile = {
  name: "gpt-oss",
  description: "gpt-oss (harmony: analysis / commentary / final channels, o200k_harmony 201,088-token vocabulary)",
  vocab_size: 201_088,
  // Reasoning is always on; its depth is the top-level reasoning_effort the harmony renderer reads.
  thinking: { kwarg: null, forward_reasoning_effort: true },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  // Harmony is rendered outside the Jinja template: /tokenize cannot be trusted to show the engine's prompt.
  token_in: "off",
  gateway_parser: null,
  tool_result_wrappers: [],
  reasoning_end: "<|end|>",
  engine_parsers: {
    vllm: { tool_call_parser: "openai", reasoning_parser: "openai_gptoss" },
    sglang: { tool_call_parser: "gpt-oss", reasoning_parser: "gpt-oss" },
  },
  notes: {
    reasoning_dropped: "harmony leaves out the analysis channel of earlier turns once a final answer follows them",
    generation_prompt_dropped: null,
    // Both rewrites are harmony's own: a turn's <|return|> and a call's constrain token are for sampling, not for history.
    rerendered:
      "the engine renders harmony history itself, not as the model wrote it (a final answer's <|return|> comes back as <|end|>, a past tool call's <|constrain|>json as \" json\"), and the profile turns token-in off",
  },
};

const MISTRAL: ModelProfile = {
  name: "mistral",
  description: "Mistral / Devstral / Magistral ([TOOL_CALLS] JSON, mistral_common tokenizer; set vocab_size per model)",
  vocab_size: null,
  thinking: { kwarg: null, forward_reasoning_effort: false },
  chat_template_kwargs: "all",
  history_normalization: "empirical",
  // mistral_common renders outside Jinja.
  token_in: "off",
  gateway_parser: null,
  tool_result_wrappers: [],
  reasoning_end: null,
  engine_parsers: {
    vllm: { tool_call_parser: "mistral", reasoning_parser: null },
    sglang: { tool_call_parser: "mistral", reasoning_parser: null },
  },
  notes: NO_NOTES,
};

export const PRESETS: Readonly<Record<string, ModelProfile>> = Object.freeze(
  Object.fromEntries([DEFAULT, QWEN3, QWEN3_CODER, QWEN25, LLAMA3, DEEPSEEK_V3, DEEPSEEK_V31, GLM45, KIMI_K2, GPT_OSS, MISTRAL].map((p) => [p.name, p])),
);

export const PRESET_NAMES: readonly string[] = Object.freeze(Object.keys(PRESETS));
