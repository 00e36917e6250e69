import { Readable } from "node:stream";
import type { Dispatcher } from "undici";

/** An engine's streamed answer as it starts: its status, and its body as it arrives. */
export interface StreamedResponse {
  statusCode: number;
  /** The body; `text()` reads it whole (an error answer's message). */
  body: Readable & { text(): Promise<string> };
}

/**
 * POSTs a JSON body to an engine for a streamed answer, through the dispatcher itself rather than
 * undici's `request()`. Same wire, same connection pool and timeouts; resolves once the answer's
 * headers are in, rejects when the engine cannot be reached (or `signal` aborts first). The body
 * is a plain Readable paced by its reader (it pauses the engine's socket when unread), destroyed
 * with the error when the answer fails midway or `signal` aborts; destroying it aborts the call.
 *
 * Why not `request()`: a streamed call's engine request is written before an agent's first token
 * can be, and `request()` costs more before it is written (a request handler with its async
 * resource, an abort-signal wrapper and a body stream made up front): 30-70 µs more (p50) before
 * the engine request was written, at one stream on a 2-vCPU VM where the process wakes cold for
 * every call.
 */
export function postForStream(dispatcher: Dispatcher, url: URL, headers: Record<string, string>, body: string, signal: AbortSignal): Promise<StreamedResponse> {
  return new Promise((resolve, reject) => {
    let controller: Dispatcher.DispatchController | null = null;
    let readable: StreamedResponse["body"] | null = null;
    let settled = false;
    let ended = false;
    const onAbort = () => controller?.abort(signal.reason);
    const done = () => signal.removeEventListener("abort", onAbort);
    const handler: Dispatcher.DispatchHandler = {
      onRequestStart(c) {
        controller = c;
        if (signal.aborted) c.abort(signal.reason);
      },
      onResponseStart(c, statusCode) {
        const r = new Readable({
          read: () => c.resume(),
          destroy: (err, callback) => {
            // Left before its end: the engine's call is cancelled (its connection closed).
            if (!c.aborted && !ended) c.abort(err ?? new Error("the engine's answer was not read to its end"));
            callback(err);
          },
        }) as StreamedResponse["body"];
        r.text = () => readText(r);
        readable = r;
        settled = true;
        resolve({ statusCode, body: r });
      },
      onResponseData(c, chunk) {
        if (readable && !readable.push(chunk)) c.pause();
      },
      onResponseEnd() {
        ended = true;
        done();
        readable?.push(null);
      },
      onResponseError(_c, err) {
        done();
        if (!settled) {
          settled = true;
          reject(err);
        } else if (readable && !readable.destroyed) readable.destroy(err);
      },
    };
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      dispatcher.dispatch({ origin: url.origin, path: url.pathname + url.search, method: "POST", headers, body }, handler);
    } catch (err) {
      done();
      reject(err);
    }
  });
}

async function readText(r: Readable): Promise<string> {
  let text = "";
  r.setEncoding("utf8");
  for await (const piece of r) text += piece as string;
  return text;
}
