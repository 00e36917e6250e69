/** vLLM's error envelope (newer servers): `{"error": {"message", "type", "param", "code"}}`. */

const TYPES: Record<number, string> = {
  400: "BadRequestError",
  404: "NotFoundError",
  500: "InternalServerError",
  503: "ServiceUnavailableError",
};

export interface VllmErrorBody {
  error: { message: string; type: string; param: string | null; code: number };
}

export function vllmError(message: string, status = 400, param: string | null = null): VllmErrorBody {
  return { error: { message, type: TYPES[status] ?? "BadRequestError", param, code: status } };
}

/** An error a route throws to answer with vLLM's envelope. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** SGLang's OpenAI-route envelope (its ErrorResponse model, flat): `{object:"error", message, type, param, code}`. */
export function sglangOpenAIError(message: string, status = 400, param: string | null = null) {
  return { object: "error", message, type: TYPES[status] ?? "BadRequestError", param, code: status };
}

/** SGLang's native-route envelope (`/generate` etc.): `{"error": {"message"}}`. */
export function sglangError(message: string) {
  return { error: { message } };
}
