import { createParser } from "eventsource-parser";
import { EngineError } from "./errors.js";

/**
 * The JSON payloads of an engine's SSE stream (vLLM's OpenAI routes), in order. `[DONE]` ends
 * nothing by itself (the body does); an in-stream `{"error": {...}}` (how vLLM reports failures
 * after the headers went out) and a payload that is not JSON are EngineErrors.
 */
export async function* sseJson(body: AsyncIterable<unknown>): AsyncGenerator<unknown> {
  const pending: string[] = [];
  const parser = createParser({ onEvent: (e) => pending.push(e.data) });
  const decoder = new TextDecoder();
  for await (const piece of body) {
    parser.feed(decoder.decode(piece as Buffer, { stream: true }));
    while (pending.length > 0) {
      const data = pending.shift()!;
      if (data === "[DONE]") continue;
      let json: unknown;
      try {
        json = JSON.parse(data);
      } catch {
        throw new EngineError(`engine sent a chunk that is not JSON: ${data.slice(0, 200)}`, 502, "bad_response");
      }
      const err = (json as { error?: { message?: unknown } } | null)?.error;
      if (err && typeof err === "object") {
        throw new EngineError(`engine error mid-stream: ${typeof err.message === "string" ? err.message : JSON.stringify(err)}`, 502, "rejected");
      }
      yield json;
    }
  }
}
