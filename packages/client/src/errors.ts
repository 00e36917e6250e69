import { ErrorBody } from "@rollgate/protocol";

/**
 * Everything the SDK throws. `status` is the HTTP status (0 when the gateway could not be reached);
 * `type`, `message` and `details` are the server's `{error: {type, message, details}}` when it sent one.
 */
export class RollgateError extends Error {
  override readonly name = "RollgateError";
  constructor(
    message: string,
    readonly status: number,
    readonly type: string,
    readonly details?: unknown,
    /** The method and path of the request that failed. */
    readonly request?: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /** The gateway could not be reached at all (connection refused, DNS, timeout). */
  get unreachable(): boolean {
    return this.status === 0;
  }

  /** The server's error body, as it sent it (or as close to it as we can say). */
  toJSON(): ErrorBody {
    return { error: { type: this.type, message: this.message, ...(this.details !== undefined ? { details: this.details } : {}) } };
  }

  /** Builds the error for a non-2xx answer from its status and raw body. */
  static fromResponse(status: number, bodyText: string, request: string, hint?: string): RollgateError {
    let parsed: unknown;
    try {
      parsed = bodyText ? JSON.parse(bodyText) : undefined;
    } catch {
      parsed = undefined;
    }
    const body = ErrorBody.safeParse(parsed);
    if (body.success) {
      const { type, message, details } = body.data.error;
      return new RollgateError(hint ? `${message} (${hint})` : message, status, type, details, request);
    }
    const text = bodyText.trim().slice(0, 300);
    const type = status === 404 ? "not_found" : status === 401 ? "unauthorized" : status >= 500 ? "internal_error" : "http_error";
    const message = hint ?? `${request} answered HTTP ${status}${text ? `: ${text}` : ""}`;
    return new RollgateError(message, status, type, undefined, request);
  }
}
