import type { RoutedExperts, ToolCall } from "@rollgate/protocol";
import type { EngineResult, EngineStreamEvent } from "./canonical.js";

/**
 * Folds a stream of engine events into the same EngineResult a non-streaming call returns, so a
 * streamed call is recorded exactly like an unstreamed one.
 */
export class StreamAccumulator {
  private promptIds: number[] = [];
  private readonly outputIds: number[] = [];
  private readonly logprobs: EngineResult["logprobs"] = [];
  /** Per output token, the version the delta carried (null where it carried none). */
  private readonly versions: (string | null)[] = [];
  private sawVersions = false;
  private content = "";
  private sawContent = false;
  private reasoning = "";
  private sawReasoning = false;
  private readonly calls = new Map<number, ToolCall>();
  private finishReason = "stop";
  private stopReason: string | number | null = null;
  private usage: EngineResult["usage"] | null = null;
  private finished = false;
  private routedExperts: RoutedExperts | null = null;
  private engineWeightVersion: string | null = null;

  push(event: EngineStreamEvent): void {
    switch (event.type) {
      case "start":
        this.promptIds = event.prompt_ids;
        break;
      case "delta": {
        // Loops, not push(...spread): no arguments list per delta, and no limit on a delta's length.
        const ids = event.token_ids;
        const lps = event.logprobs;
        const versions = event.versions;
        for (let i = 0; i < ids.length; i++) this.outputIds.push(ids[i]!);
        for (let i = 0; i < lps.length; i++) this.logprobs.push(lps[i]!);
        if (versions) this.sawVersions = true;
        for (let i = 0; i < ids.length; i++) this.versions.push(versions?.[i] ?? null);
        if (event.content !== undefined) {
          this.content += event.content;
          this.sawContent = true;
        }
        if (event.reasoning !== undefined) {
          this.reasoning += event.reasoning;
          this.sawReasoning = true;
        }
        for (const d of event.tool_calls ?? []) {
          const call = this.calls.get(d.index) ?? { id: "", type: "function" as const, function: { name: "", arguments: "" } };
          if (d.id) call.id = d.id;
          if (d.function?.name) call.function.name += d.function.name;
          if (d.function?.arguments) call.function.arguments += d.function.arguments;
          this.calls.set(d.index, call);
        }
        break;
      }
      case "finish":
        this.finishReason = event.finish_reason;
        this.stopReason = event.stop_reason;
        this.finished = true;
        if (event.routed_experts) this.routedExperts = event.routed_experts;
        if (event.prompt_ids) this.promptIds = event.prompt_ids;
        if (event.engine_weight_version !== undefined) this.engineWeightVersion = event.engine_weight_version;
        break;
      case "usage":
        this.usage = event.usage;
        break;
    }
  }

  get isFinished(): boolean {
    return this.finished;
  }

  result(): EngineResult {
    const toolCalls = [...this.calls.entries()].sort(([a], [b]) => a - b).map(([, c]) => c);
    return {
      prompt_ids: this.promptIds,
      output_ids: this.outputIds,
      output_logprobs: this.logprobs.map((l) => l.logprob),
      logprobs: this.logprobs,
      message: {
        content: this.sawContent && this.content !== "" ? this.content : null,
        reasoning: this.sawReasoning ? this.reasoning : null,
        tool_calls: toolCalls,
      },
      finish_reason: this.finishReason,
      stop_reason: this.stopReason,
      usage: this.usage ?? {
        prompt_tokens: this.promptIds.length,
        completion_tokens: this.outputIds.length,
        cached_tokens: 0,
      },
      ...(this.sawVersions ? { output_versions: this.versions } : {}),
      ...(this.routedExperts ? { routed_experts: this.routedExperts } : {}),
      ...(this.engineWeightVersion !== null ? { engine_weight_version: this.engineWeightVersion } : {}),
    };
  }
}

/**
 * The events of a whole answer, in stream order: what a stream of it would have carried, for an
 * engine that answers only whole (StreamAccumulator folds them back into the same result).
 */
export function resultAsEvents(r: EngineResult): EngineStreamEvent[] {
  return [
    { type: "start", prompt_ids: r.prompt_ids },
    {
      type: "delta",
      ...(r.message.reasoning ? { reasoning: r.message.reasoning } : {}),
      ...(r.message.content ? { content: r.message.content } : {}),
      ...(r.message.tool_calls.length > 0
        ? { tool_calls: r.message.tool_calls.map((t, index) => ({ index, id: t.id, type: "function" as const, function: { ...t.function } })) }
        : {}),
      token_ids: r.output_ids,
      logprobs: r.logprobs,
      ...(r.output_versions ? { versions: r.output_versions } : {}),
    },
    {
      type: "finish",
      finish_reason: r.finish_reason,
      stop_reason: r.stop_reason,
      ...(r.routed_experts ? { routed_experts: r.routed_experts } : {}),
      ...(r.engine_weight_version !== undefined ? { engine_weight_version: r.engine_weight_version } : {}),
    },
    { type: "usage", usage: r.usage },
  ];
}
