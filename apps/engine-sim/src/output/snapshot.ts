import type { Delta, DeltaToolCall, StreamingParser } from "./types.js";

/**
 * Streaming by snapshots: after each token the parser states what it can tell from the output so
 * far (reasoning, content, tool calls with the name once complete and a prefix of the arguments
 * that later tokens cannot change); the streamer sends what is new. The pieces concatenate to what
 * the non-streaming parse returns, as vLLM's incremental parsers' do.
 */

export interface SnapshotCall {
  /** Null until the name is complete. */
  name: string | null;
  /** A prefix of the final arguments text. */
  args: string;
}

export interface Snapshot {
  reasoning: string;
  content: string;
  calls: SnapshotCall[];
}

/** `final`: the last token is in (hold nothing back). */
export type SnapshotFn = (text: string, ids: readonly number[], final: boolean) => Snapshot;

export interface StreamerOptions {
  /** The first tool-call delta carries `arguments: ""` beside the name (qwen3_coder does; most parsers send the name alone). */
  emptyArgsWithName?: boolean;
  /** The id of a streamed tool call (vLLM: "chatcmpl-tool-…"; qwen3_coder: "call_…"). */
  makeId: () => string;
}

export class SnapshotStreamer implements StreamingParser {
  private text = "";
  private readonly ids: number[] = [];
  private sentReasoning = 0;
  private sentContent = 0;
  private readonly sentArgs: number[] = [];
  private readonly namesSent: boolean[] = [];
  toolsStreamed = 0;

  constructor(
    private readonly snapshot: SnapshotFn,
    private readonly opts: StreamerOptions,
  ) {}

  push(id: number, deltaText: string, isLast: boolean): Delta | null {
    this.text += deltaText;
    this.ids.push(id);
    const s = this.snapshot(this.text, this.ids, isLast);
    const delta: Delta = {};
    if (s.reasoning.length > this.sentReasoning) {
      delta.reasoning = s.reasoning.slice(this.sentReasoning);
      this.sentReasoning = s.reasoning.length;
    }
    if (s.content.length > this.sentContent) {
      delta.content = s.content.slice(this.sentContent);
      this.sentContent = s.content.length;
    }
    const calls: DeltaToolCall[] = [];
    s.calls.forEach((c, index) => {
      if (c.name === null) return;
      let d: DeltaToolCall | undefined;
      if (!this.namesSent[index]) {
        this.namesSent[index] = true;
        this.sentArgs[index] = 0;
        this.toolsStreamed++;
        d = { id: this.opts.makeId(), type: "function", index, function: this.opts.emptyArgsWithName ? { name: c.name, arguments: "" } : { name: c.name } };
      }
      const sent = this.sentArgs[index] ?? 0;
      if (c.args.length > sent) {
        const more = c.args.slice(sent);
        this.sentArgs[index] = c.args.length;
        if (d) d.function.arguments = (d.function.arguments ?? "") + more;
        else d = { index, function: { arguments: more } };
      }
      if (d) calls.push(d);
    });
    if (calls.length > 0) delta.tool_calls = calls;
    return Object.keys(delta).length > 0 ? delta : null;
  }
}
