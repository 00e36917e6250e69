import { Template } from "@huggingface/jinja";
import type { ArgumentsForm, TemplateFeed } from "./families/types.js";
import { PyDict, PyJsonError, fromJs, parsePyJson, pyDumps, toJs } from "@rollgate/pyjson";
import type { PyValue } from "@rollgate/pyjson";

/**
 * A chat template rendered the way vLLM's chat_utils + transformers' apply_chat_template do.
 * What vLLM does to messages before the template sees them (and what we mirror):
 *  - `content: null` → "", content arrays of text parts → joined with "\n" ("string" content format);
 *  - assistant `tool_calls[].function.arguments` JSON strings → parsed to dicts (chat_utils
 *    `_postprocess_messages`); empty/missing → {};
 *  - assistant `reasoning` / `reasoning_content` → both keys set (vLLM ≥0.11 `_parse_chat_message_content`);
 *  - tools → `ChatCompletionToolsParam.model_dump()`: `{type, function: {name, description, parameters, …}}`.
 * Jinja's `tojson` must print Python `json.dumps` bytes; @huggingface/jinja gets separators right
 * but loses floats like `1.0` and reorders integer-like keys, so tool lines it printed are patched
 * with `pyDumps` (below), and a family may hand arguments over as `json.dumps` text (Qwen3's template
 * prints string arguments verbatim) or add pre-rendered fields its bundled template reads.
 */

const tojsonTemplate = new Template("{{ x | tojson }}");

/** A request the client got wrong; the route answers 400 with vLLM's envelope. */
export class ChatRenderError extends Error {}

export interface ChatRenderInput {
  messages: readonly unknown[];
  /** Tools as parsed with Python semantics (from the raw request body). */
  tools?: readonly PyValue[] | null;
  addGenerationPrompt?: boolean;
  continueFinalMessage?: boolean;
  chatTemplateKwargs?: Record<string, unknown> | null;
  /** Request fields a family's template reads beside the kwargs (gpt-oss: reasoning_effort). */
  requestVars?: Record<string, unknown>;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Text of a message `content` as vLLM's "string" content format builds it. */
export function contentText(content: unknown): string {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    const texts: string[] = [];
    for (const part of content) {
      if (typeof part === "string") texts.push(part);
      else if (isRecord(part) && (part.type === "text" || part.type === "input_text") && typeof part.text === "string") texts.push(part.text);
      else if (isRecord(part) && part.type === "refusal" && typeof part.refusal === "string") texts.push(part.refusal);
      else throw new ChatRenderError(`Unsupported content part type: ${isRecord(part) ? String(part.type) : typeof part}`);
    }
    return texts.join("\n");
  }
  throw new ChatRenderError("message content must be a string, an array of content parts or null");
}

/** Normalises one tool like pydantic's `ChatCompletionToolsParam.model_dump()` (declared fields first). */
export function normaliseTool(tool: PyValue): PyDict {
  if (!(tool instanceof PyDict)) throw new ChatRenderError("each tool must be an object");
  const fn = tool.get("function");
  if (!(fn instanceof PyDict) || typeof fn.get("name") !== "string") throw new ChatRenderError("tools[].function.name is required");
  const fnDeclared = ["name", "description", "parameters"];
  const fnEntries: [string, PyValue][] = [
    ["name", fn.get("name")!],
    ["description", fn.get("description") ?? null],
    ["parameters", fn.get("parameters") ?? null],
    ...fn.entries.filter(([k]) => !fnDeclared.includes(k)),
  ];
  return new PyDict([
    ["type", tool.get("type") ?? "function"],
    ["function", new PyDict(fnEntries)],
    ...tool.entries.filter(([k]) => k !== "type" && k !== "function"),
  ]);
}

/** Tool-call arguments as the template must print them (Python json.dumps of the parsed dict). */
function renderArguments(args: unknown): string {
  if (args === null || args === undefined || args === "") return "{}";
  if (typeof args === "string") {
    try {
      return pyDumps(parsePyJson(args));
    } catch (e) {
      if (e instanceof PyJsonError) throw new ChatRenderError(`tool call arguments are not valid JSON: ${e.message}`);
      throw e;
    }
  }
  return pyDumps(fromJs(args));
}

/** Arguments as vLLM's `_postprocess_messages` leaves them: a dict ({} for empty or invalid JSON). */
function argumentsDict(args: unknown): unknown {
  if (typeof args === "string") {
    try {
      const v = parsePyJson(args);
      return v instanceof PyDict || Array.isArray(v) ? toJs(v) : {};
    } catch {
      return {};
    }
  }
  return args !== null && typeof args === "object" ? args : {};
}

/** Arguments as a Python-typed dict (key order and int/float kept), {} for empty or invalid JSON. */
function argumentsPy(args: unknown): PyValue {
  if (typeof args === "string") {
    try {
      const v = parsePyJson(args);
      return v instanceof PyDict ? v : new PyDict([]);
    } catch {
      return new PyDict([]);
    }
  }
  const v = fromJs(args);
  return v instanceof PyDict ? v : new PyDict([]);
}

/** The conversation as vLLM hands it to the template. */
export function templateMessages(messages: readonly unknown[], argumentsAs: ArgumentsForm = "json-text"): Record<string, unknown>[] {
  return messages.map((m, idx) => {
    if (!isRecord(m) || typeof m.role !== "string") throw new ChatRenderError(`messages[${idx}] must be an object with a role`);
    const out: Record<string, unknown> = { role: m.role, content: contentText(m.content) };
    if (m.role === "assistant") {
      if (Array.isArray(m.tool_calls)) {
        out.tool_calls = m.tool_calls.map((tc: unknown) => {
          if (!isRecord(tc) || !isRecord(tc.function)) throw new ChatRenderError("assistant tool_calls[] must have a function");
          const a = tc.function.arguments;
          const args = argumentsAs === "dict" ? argumentsDict(a) : argumentsAs === "python" ? argumentsPy(a) : argumentsAs === "raw" ? (typeof a === "string" ? a : a ? JSON.stringify(a) : "") : renderArguments(a);
          return { ...tc, function: { ...tc.function, arguments: args } };
        });
      }
      // Python's `reasoning or reasoning_content`: JS `||` has the same semantics.
      const r = m.reasoning || m.reasoning_content;
      if (r !== null && r !== undefined) {
        out.reasoning = r;
        out.reasoning_content = r;
      }
    } else if (m.role === "tool" && typeof m.tool_call_id === "string") out.tool_call_id = m.tool_call_id;
    if (typeof m.name === "string") out.name = m.name;
    return out;
  });
}

/** transformers' continue_final_message: cut the render right after the final message's content. */
function cutAfterFinalMessage(rendered: string, finalMessage: string): string {
  const stripped = finalMessage.trim();
  const loc = rendered.lastIndexOf(stripped);
  if (!stripped || loc < 0) {
    throw new ChatRenderError("continue_final_message is set but the final message does not appear in the chat after applying the chat template!");
  }
  const lstripped = finalMessage.trimStart();
  if (rendered.slice(loc, loc + lstripped.length) === finalMessage) return rendered.slice(0, loc + lstripped.length);
  return rendered.slice(0, loc + stripped.length);
}

export interface RendererOptions {
  template: string;
  argumentsAs: ArgumentsForm;
  feed: TemplateFeed;
}

/** One chat template with its family's feed; renders prompts exactly as vLLM would. */
export class ChatRenderer {
  private compiled: Template | undefined;
  constructor(readonly opts: RendererOptions) {}

  private template(): Template {
    try {
      return (this.compiled ??= new Template(this.opts.template));
    } catch (e) {
      throw new ChatRenderError(`chat template error: ${(e as Error).message}`);
    }
  }

  /** Renders with the family's template, or with a per-request `chat_template` (vLLM's request field). */
  render(input: ChatRenderInput, requestTemplate?: string | null): string {
    const addGenerationPrompt = input.addGenerationPrompt ?? true;
    const continueFinal = input.continueFinalMessage ?? false;
    if (addGenerationPrompt && continueFinal) {
      throw new ChatRenderError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
    }
    let messages = templateMessages(input.messages, this.opts.argumentsAs);
    if (messages.length === 0) throw new ChatRenderError("messages must not be empty");
    const feed = this.opts.feed;
    if (feed.messages) messages = feed.messages(messages);
    const pyTools = input.tools ? input.tools.map(normaliseTool) : null;
    let jsTools = pyTools ? pyTools.map((t) => toJs(t) as Record<string, unknown>) : undefined;
    if (jsTools && pyTools && feed.tools) jsTools = feed.tools(jsTools, pyTools);
    const ctx: Record<string, unknown> = {
      ...feed.vars,
      ...(input.requestVars ?? {}),
      ...(input.chatTemplateKwargs ?? {}),
      messages,
      add_generation_prompt: addGenerationPrompt,
    };
    if (jsTools && jsTools.length > 0) ctx.tools = jsTools;
    let tpl: Template;
    if (requestTemplate) {
      try {
        tpl = new Template(requestTemplate);
      } catch (e) {
        throw new ChatRenderError(`chat template error: ${(e as Error).message}`);
      }
    } else tpl = this.template();
    let rendered: string;
    try {
      rendered = tpl.render(ctx);
    } catch (e) {
      throw new ChatRenderError(`chat template error: ${(e as Error).message}`);
    }
    // Patch tool lines: what @huggingface/jinja printed for each tool → Python json.dumps bytes.
    if (pyTools) {
      let from = 0;
      pyTools.forEach((t) => {
        const jsJson = tojsonTemplate.render({ x: toJs(t) });
        const at = rendered.indexOf(jsJson, from);
        if (at < 0) return;
        const py = pyDumps(t);
        rendered = rendered.slice(0, at) + py + rendered.slice(at + jsJson.length);
        from = at + py.length;
      });
    }
    if (continueFinal) {
      const last = input.messages[input.messages.length - 1] as Record<string, unknown>;
      let final: string;
      if (Array.isArray(last.content)) {
        const texts = last.content.filter((p): p is { text: string } => isRecord(p) && typeof p.text === "string");
        if (texts.length === 0) throw new ChatRenderError("continue_final_message is set but the final message has no text");
        final = texts[texts.length - 1]!.text;
      } else final = contentText(last.content);
      rendered = cutAfterFinalMessage(rendered, final);
    }
    return rendered;
  }
}
