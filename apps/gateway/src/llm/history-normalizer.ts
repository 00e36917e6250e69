import type { ChatMessage } from "@rollgate/protocol";
import { candidateForms, chooseForm, turnShape, type Normalization } from "@rollgate/transforms";
import type { EngineTokenizer, TokenizeCall } from "../engines/tokenizer.js";
import { recordedView, type BaseIds } from "./continuation.js";

/** Inconclusive tries after which a shape is left as generated (each try costs a few renders). */
const MAX_TRIES = 3;

/**
 * What this gateway has learned, per engine, model and template switches, about how its chat
 * template re-renders each shape of echoed assistant turn (transforms/history-normalization.ts):
 * the form that reproduces the recorded ids. Learned from the first turn of a shape whose record
 * the call extends, by rendering each candidate form through the engine; kept for the process.
 */
export class HistoryNormalizer {
  private readonly forms = new Map<string, Map<string, Normalization>>();
  private readonly tries = new Map<string, number>();

  private key(call: TokenizeCall): string {
    return `${call.target.engine.url}\u0000${call.model}\u0000${JSON.stringify(call.request.chat_template_kwargs ?? {})}\u0000${String(call.request.enable_thinking)}`;
  }

  /** The forms learned so far for this call's engine (shape → form). */
  learned(call: TokenizeCall): ReadonlyMap<string, Normalization> {
    return this.forms.get(this.key(call)) ?? new Map();
  }

  /** Everything learned, per engine key, for the preflight report. */
  snapshot(engineUrl: string): Record<string, Normalization> {
    const out: Record<string, Normalization> = {};
    for (const [key, forms] of this.forms) if (key.startsWith(`${engineUrl}\u0000`)) for (const [shape, form] of forms) out[shape] = form;
    return out;
  }

  /**
   * Learns the form of the turn at `index` of `messages` (restored as generated from `record`)
   * if its shape has none yet: renders the conversation up to the turn, in each candidate form,
   * plus the message after it, and keeps the form whose render starts with the record's prompt
   * and output ids. Returns the form now known for that shape (null: none yet).
   */
  async learn(
    tokenizer: EngineTokenizer,
    call: TokenizeCall,
    messages: readonly ChatMessage[],
    index: number,
    /** The record, or how to read it (only when there is something to learn; null: not found). */
    recorded: Pick<BaseIds, "prompt_ids" | "output_ids"> | (() => PromiseLike<Pick<BaseIds, "prompt_ids" | "output_ids"> | null>),
  ): Promise<Normalization | null> {
    const turn = messages[index];
    const next = messages[index + 1];
    if (turn?.role !== "assistant" || !next) return null;
    const key = this.key(call);
    const shape = turnShape(turn);
    const known = this.forms.get(key)?.get(shape);
    if (known) return known;
    const triesKey = `${key}\u0000${shape}`;
    if ((this.tries.get(triesKey) ?? 0) >= MAX_TRIES) return null;
    const record = typeof recorded === "function" ? await recorded() : recorded;
    if (!record) return null;
    const before = messages.slice(0, index);
    const candidates = candidateForms(turn);
    const renders = await Promise.all(
      candidates.map(async (c) => ({ form: c.form, ids: (await tokenizer.renderChat(call, [...before, c.message, next])).ids })),
    );
    const form = chooseForm(renders, recordedView(record, null));
    if (!form) {
      this.tries.set(triesKey, (this.tries.get(triesKey) ?? 0) + 1);
      return null;
    }
    let forEngine = this.forms.get(key);
    if (!forEngine) this.forms.set(key, (forEngine = new Map()));
    forEngine.set(shape, form);
    return form;
  }
}
