/** What the gateway's tests read back from an OpenAI chat SSE answer. */

export interface AssistantAnswer {
  content: string | null;
  reasoning: string | null;
  tool_calls: { id: string; function: { name: string; arguments: string } }[];
}

/** A streamed tool call's pieces, as OpenAI chat deltas carry them. */
export interface ToolCallDelta {
  index: number;
  id?: string;
  function?: { name?: string; arguments?: string };
}

/** Folds one chunk's tool-call deltas into the calls read so far (by index, names and arguments appended). */
export function addToolCallDeltas(calls: { id: string; type: "function"; function: { name: string; arguments: string } }[], deltas: readonly ToolCallDelta[] | undefined): void {
  for (const t of deltas ?? []) {
    const c = (calls[t.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
    if (t.id) c.id = t.id;
    if (t.function?.name) c.function.name += t.function.name;
    if (t.function?.arguments) c.function.arguments += t.function.arguments;
  }
}

/** Reads an OpenAI chat SSE answer back into one message (an error chunk throws). */
export function fromSse(payload: string): AssistantAnswer {
  let content = "";
  let reasoning: string | null = null;
  const calls: Parameters<typeof addToolCallDeltas>[0] = [];
  for (const line of payload.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { error?: unknown; choices: { delta: Record<string, unknown> }[] };
    if (chunk.error) throw new Error(`stream error: ${JSON.stringify(chunk.error)}`);
    const d = chunk.choices[0]?.delta as
      | { content?: string | null; reasoning?: string | null; tool_calls?: ToolCallDelta[] }
      | undefined;
    if (!d) continue;
    if (d.content) content += d.content;
    if (d.reasoning) reasoning = (reasoning ?? "") + d.reasoning;
    addToolCallDeltas(calls, d.tool_calls);
  }
  return { content: content === "" ? null : content, reasoning, tool_calls: calls.map(({ id, function: f }) => ({ id, function: f })) };
}
