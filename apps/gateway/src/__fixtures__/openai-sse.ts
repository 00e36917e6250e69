/** What the gateway's tests read back from an OpenAI chat SSE answer. */

export interface AssistantAnswer {
  content: string | null;
  reasoning: string | null;
  tool_calls: { id: string; function: { name: string; arguments: string } }[];
}

/** Reads an OpenAI chat SSE answer back into one message (an error chunk throws). */
export function fromSse(payload: string): AssistantAnswer {
  let content = "";
  let reasoning: string | null = null;
  const calls: AssistantAnswer["tool_calls"] = [];
  for (const line of payload.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { error?: unknown; choices: { delta: Record<string, unknown> }[] };
    if (chunk.error) throw new Error(`stream error: ${JSON.stringify(chunk.error)}`);
    const d = chunk.choices[0]?.delta as
      | { content?: string | null; reasoning?: string | null; tool_calls?: { index: number; id?: string; function?: { name?: string; arguments?: string } }[] }
      | undefined;
    if (!d) continue;
    if (d.content) content += d.content;
    if (d.reasoning) reasoning = (reasoning ?? "") + d.reasoning;
    for (const t of d.tool_calls ?? []) {
      const c = (calls[t.index] ??= { id: "", function: { name: "", arguments: "" } });
      if (t.id) c.id = t.id;
      if (t.function?.name) c.function.name += t.function.name;
      if (t.function?.arguments) c.function.arguments += t.function.arguments;
    }
  }
  return { content: content === "" ? null : content, reasoning, tool_calls: calls };
}
