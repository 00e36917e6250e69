import type { Readable } from "node:stream";
import { StringDecoder } from "node:string_decoder";
import { createParser, type EventSourceParser } from "eventsource-parser";
import { brokeOff, EngineError } from "./errors.js";

/** Payloads parsed ahead of the reader before the engine's body is paused (a reader that stalls). */
const HIGH_WATER = 256;

/**
 * The JSON payloads of an engine's SSE stream (vLLM's OpenAI routes), in order. `[DONE]` ends
 * nothing by itself (the body does), but a payload after it is an EngineError; so are an in-stream
 * `{"error": {...}}` (how vLLM reports failures after the headers went out) and a payload that is
 * not JSON, after the payloads before them. The reader leaving early destroys the body (the
 * engine's connection is closed).
 *
 * The body is read off its 'data' events, not with a for-await over the stream: every engine chunk
 * is its own event-loop turn (a token each 20 ms or so), and the stream's async iterator plus a
 * generator around it were several promises and microtasks per chunk; this is one.
 */
export function sseJson(body: Readable, from?: EngineSource): AsyncIterableIterator<unknown> {
  return new SseJsonReader(body, from);
}

/**
 * Where a body comes from: a body that breaks off (reset, closed before its end, the engine timeout)
 * is then the engine's failure (errors.ts brokeOff), unless `signal` ended it.
 */
export interface EngineSource {
  url: string;
  signal?: AbortSignal;
}

/**
 * The same payloads handed to `onJson` as each is parsed, in the engine read that brought it: for a
 * reader that folds them synchronously (no promise and microtask per payload). Resolves at the
 * body's end; rejects on the first error (the stream's or an EngineError as above, or what `onJson`
 * threw), after the payloads before it, and the body is destroyed.
 */
export function sseEach(body: Readable, onJson: (json: unknown) => void, from?: EngineSource): Promise<void> {
  return new Promise((resolve, reject) => {
    new SsePayloads(body, onJson, (error) => (error ? reject(error) : resolve()), from);
  });
}

/** The body's SSE payloads, parsed as they arrive, told to `deliver`; `close` is told once. */
class SsePayloads {
  /** Set when the stream can give nothing more: its end, or why it failed. */
  private closed = false;
  private readonly parser: EventSourceParser;
  // A StringDecoder, not a TextDecoder: the same UTF-8 decoding (a character split across pieces
  // is held back, bad bytes become U+FFFD) at a fraction of the cost per piece (TextDecoder's
  // streaming decode was several µs per engine read). The BOM TextDecoder dropped is dropped below.
  private readonly decoder = new StringDecoder("utf8");
  private first = true;
  /** `[DONE]` came: the stream is over, and a payload after it is the engine's fault. */
  private done = false;

  constructor(
    private readonly body: Readable,
    private readonly deliver: (json: unknown) => void,
    private readonly onClose: (error: unknown) => void,
    private readonly from?: EngineSource,
  ) {
    this.parser = createParser({ onEvent: (e) => this.onData(e.data) });
    // The error listener stays for the body's life: an error after the reader left is not thrown.
    body.on("error", (err) => this.close(this.broke(err)));
    body.on("end", () => this.close(null));
    // Destroyed without an error and before its end (what a for-await over the body would throw).
    // The error is made only then: every body closes after its end too, and an Error's stack
    // capture on each engine call was 1.6% of the gateway's CPU samples.
    body.on("close", () => {
      if (!this.closed) this.close(this.broke(Object.assign(new Error("Premature close"), { code: "ERR_STREAM_PREMATURE_CLOSE" })));
    });
    body.on("data", (piece: Buffer) => {
      if (this.closed) return;
      let text = this.decoder.write(piece);
      if (this.first && text !== "") {
        this.first = false;
        if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      }
      this.parser.feed(text);
    });
  }

  private onData(data: string): void {
    if (this.closed) return;
    if (this.done) {
      this.fail(new EngineError(`engine sent data after [DONE]: ${data.slice(0, 200)}`, 502, "bad_response"));
      return;
    }
    if (data === "[DONE]") {
      this.done = true;
      return;
    }
    let json: unknown;
    try {
      json = JSON.parse(data);
    } catch {
      this.fail(new EngineError(`engine sent a chunk that is not JSON: ${data.slice(0, 200)}`, 502, "bad_response"));
      return;
    }
    const err = (json as { error?: { message?: unknown } } | null)?.error;
    if (err && typeof err === "object") {
      this.fail(new EngineError(`engine error mid-stream: ${typeof err.message === "string" ? err.message : JSON.stringify(err)}`, 502, "rejected"));
      return;
    }
    try {
      this.deliver(json);
    } catch (error) {
      this.fail(error);
    }
  }

  /** The body's own failure: the engine's, when it is known where the body comes from. */
  private broke(err: unknown): unknown {
    return this.from ? brokeOff(this.from.url, err, this.from.signal) : err;
  }

  /** A bad payload ends the stream: the reader has had the payloads before it, then the error. */
  private fail(err: unknown): void {
    this.close(err);
    this.body.destroy();
  }

  close(error: unknown): void {
    if (this.closed) return;
    this.closed = true;
    this.onClose(error);
  }
}

class SseJsonReader implements AsyncIterableIterator<unknown> {
  private readonly ready: unknown[] = [];
  private head = 0;
  /** Set when the stream can give nothing after the ready payloads: its end, or why it failed. */
  private closed: { error: unknown } | null = null;
  private waiting: { resolve: (r: IteratorResult<unknown>) => void; reject: (err: unknown) => void } | null = null;
  private readonly payloads: SsePayloads;

  constructor(
    private readonly body: Readable,
    from?: EngineSource,
  ) {
    this.payloads = new SsePayloads(
      body,
      (json) => this.onJson(json),
      (error) => this.close(error),
      from,
    );
  }

  private onJson(json: unknown): void {
    const w = this.waiting;
    if (w) {
      this.waiting = null;
      w.resolve({ value: json, done: false });
      return;
    }
    this.ready.push(json);
    if (this.ready.length - this.head >= HIGH_WATER) this.body.pause();
  }

  private close(error: unknown): void {
    if (this.closed) return;
    this.closed = { error };
    const w = this.waiting;
    if (!w) return;
    this.waiting = null;
    if (error) w.reject(error);
    else w.resolve({ value: undefined, done: true });
  }

  next(): Promise<IteratorResult<unknown>> {
    if (this.head < this.ready.length) {
      const value = this.ready[this.head];
      this.ready[this.head++] = undefined;
      if (this.head === this.ready.length) {
        this.ready.length = 0;
        this.head = 0;
        if (this.body.isPaused() && !this.closed) this.body.resume();
      }
      return Promise.resolve({ value, done: false });
    }
    if (this.closed) {
      const { error } = this.closed;
      // Told once: a later next() is the end.
      this.closed = { error: null };
      return error ? Promise.reject(error) : Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => (this.waiting = { resolve, reject }));
  }

  return(): Promise<IteratorResult<unknown>> {
    this.payloads.close(null);
    this.ready.length = 0;
    this.head = 0;
    if (!this.body.destroyed) this.body.destroy();
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<unknown> {
    return this;
  }
}
