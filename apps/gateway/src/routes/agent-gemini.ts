import { randomUUID } from "node:crypto";
import {
  GeminiStreamEncoder,
  fromGemini,
  geminiError,
  geminiStreamClose,
  geminiStreamFrame,
  geminiStreamOpen,
  toGeminiResponse,
  type GeminiStreamMode,
} from "@rollgate/transforms";
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import { ZodError, z } from "zod";
import type { GatewayContext } from "../context.js";
import { SidParams } from "./schemas.js";
import {
  AGENT_BODY_LIMIT,
  authorizeSession,
  clientAbortSignal,
  agentFailure,
  agentSchema,
  failureOf,
  isAuthFailure,
  rejectInvalid,
  startSse,
  corkedWriter,
  type AuthFailure,
  type AuthorizedSession,
} from "./agent-common.js";

/**
 * The Gemini API routes of one session (`GOOGLE_GEMINI_BASE_URL` = `<gw>/s/<sid>`):
 * `POST /s/:sid/v1beta/models/{model}:generateContent | :streamGenerateContent | :countTokens`
 * (also under `/v1/`), `GET /s/:sid/v1beta/models[/{model}]`.
 *
 * The key comes in `x-goog-api-key` (what @google/genai sends) or `?key=`. A wrong key is 401
 * UNAUTHENTICATED with an ErrorInfo reason `API_KEY_INVALID` (Google itself answers 400 for a bad
 * API key; 401 says what happened and is not retried by Gemini CLI or the SDK either). Streaming
 * answers SSE (`data: …\r\n\r\n`) with `?alt=sse`, otherwise a JSON array written element by
 * element, as Google does.
 */

type Params = { sid: string; "*": string };
type Query = { alt?: string; key?: string };

const GeminiQuery = z.object({
  key: z.string().optional().describe("the session token, when not sent as x-goog-api-key"),
  alt: z.string().optional().describe("`sse`: stream as Server-Sent Events instead of a JSON array"),
});
/** Checked by each method's own parser (`fromGemini`); countTokens also takes `{generateContentRequest}`. */
const GeminiBody = z.looseObject({}).optional().describe("a Gemini GenerateContentRequest (countTokens: also `{generateContentRequest}`)");
const MODEL_PATH = "the model and method: `{model}:generateContent`, `{model}:streamGenerateContent` or `{model}:countTokens` (any model name: the session's model answers)";
const ModelParams = SidParams.extend({ "*": z.string().describe("a model name (any: the session's model answers)") });
const MethodParams = SidParams.extend({ "*": z.string().describe(MODEL_PATH) });

const ACTIONS = new Set(["generateContent", "streamGenerateContent", "countTokens"]);

function zodMessage(err: ZodError): string {
  return err.issues
    .map((i) => {
      const path = i.path.map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`)).join("").replace(/^\./, "");
      return `${path || "body"}: ${i.message}`;
    })
    .join("; ");
}

/** Any failure in Google's error shape, which @google/genai surfaces as ApiError with its status. */
function sendGeminiError(reply: FastifyReply, err: unknown) {
  if (err instanceof ZodError) return reply.code(400).send(geminiError(400, `Invalid request: ${zodMessage(err)}`));
  const f = failureOf(err);
  return reply.code(f.status).send(geminiError(f.status, f.message, f.kind));
}

function sendAuthFailure(reply: FastifyReply, f: AuthFailure) {
  const reason = f.kind === "invalid_token" ? "API_KEY_INVALID" : "SESSION_CLOSED";
  return reply.code(f.status).send(geminiError(f.status, f.message, reason));
}

/** Splits `gemini-2.5-flash:generateContent` (a leading `models/` tolerated). */
function splitModelAction(target: string): { model: string; action: string } | null {
  const at = target.lastIndexOf(":");
  if (at <= 0) return null;
  return { model: target.slice(0, at).replace(/^models\//, ""), action: target.slice(at + 1) };
}

/** Takes over the response for the JSON-array stream form. */
function startJsonStream(reply: FastifyReply): (frame: string) => void {
  reply.hijack();
  reply.raw.writeHead(200, { "content-type": "application/json; charset=UTF-8", "cache-control": "no-cache" });
  return corkedWriter(reply.raw);
}

export function geminiAgentRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    // Every failure answered here is checked for a lost call first (agentFailure).
    app.setErrorHandler(async (err, req, reply) => {
      await agentFailure(ctx, req, reply, err);
      return sendGeminiError(reply, err);
    });

    const authorize = (req: FastifyRequest<{ Params: { sid: string }; Querystring: Query }>, takeSeq = false) =>
      authorizeSession(ctx, req, req.params.sid, typeof req.query.key === "string" ? req.query.key : undefined, { takeSeq });

    const modelInfo = (name: string) => ({
      name: `models/${name}`,
      baseModelId: name,
      version: "rollgate",
      displayName: name,
      supportedGenerationMethods: ["generateContent", "streamGenerateContent", "countTokens"],
      thinking: true,
    });
    const servedName = (auth: AuthorizedSession) => auth.session.model ?? auth.session.assignment?.served_model ?? "unknown";

    const listSchema = { ...agentSchema("The served model (Gemini shape)", "The session's model, as Gemini's model list."), querystring: GeminiQuery };
    app.get<{ Params: { sid: string }; Querystring: Query }>("/s/:sid/v1beta/models", { schema: listSchema }, async (req, reply) => {
      const auth = await authorize(req);
      if (isAuthFailure(auth)) return sendAuthFailure(reply, auth);
      return { models: [modelInfo(servedName(auth))] };
    });

    const modelSchema = { ...agentSchema("A model (Gemini shape)", "Any model name: the session's model answers."), params: ModelParams, querystring: GeminiQuery };
    app.get<{ Params: Params; Querystring: Query }>("/s/:sid/v1beta/models/*", { schema: modelSchema }, async (req, reply) => {
      const auth = await authorize(req);
      if (isAuthFailure(auth)) return sendAuthFailure(reply, auth);
      // Any model name the agent uses is served by the session's model.
      return modelInfo(req.params["*"].replace(/^models\//, ""));
    });

    const handler = async (req: FastifyRequest<{ Params: Params; Querystring: Query }>, reply: FastifyReply) => {
      // A generation takes its sequence number with the session read (authorizeSession).
      const action = splitModelAction(req.params["*"])?.action;
      const auth = await authorize(req, action === "generateContent" || action === "streamGenerateContent");
      if (isAuthFailure(auth)) return sendAuthFailure(reply, auth);
      rejectInvalid(req);
      const target = splitModelAction(req.params["*"]);
      if (!target || !ACTIONS.has(target.action)) {
        return reply.code(404).send(geminiError(404, `no such method: ${req.params["*"]} (supported: generateContent, streamGenerateContent, countTokens)`));
      }
      const signal = clientAbortSignal(reply);

      if (target.action === "countTokens") {
        const body = (req.body ?? {}) as Record<string, unknown>;
        const inner = body.generateContentRequest ?? body.generate_content_request ?? body;
        const call = fromGemini(inner, { key: auth.tokenHash });
        return { totalTokens: await ctx.caller.countTokens(auth.session, call.canonical, signal) };
      }

      const stream = target.action === "streamGenerateContent";
      const call = fromGemini(req.body, { key: auth.tokenHash, stream });
      const prepared = await ctx.caller.prepare(auth, "gemini", call.canonical, signal);
      const out = {
        model: target.model || prepared.engineCall.model,
        responseId: randomUUID().replaceAll("-", ""),
        key: auth.tokenHash,
        includeThoughts: call.includeThoughts,
        clientLogprobs: call.canonical.client_logprobs,
        reasoningEnd: prepared.target.profile.reasoning_end,
      };
      if (!stream) return toGeminiResponse(await ctx.caller.complete(prepared), out);

      // Open the engine stream before answering, so an engine that refuses the call still gets a
      // proper HTTP error; from the first event on, the answer is streamed.
      const events = ctx.caller.stream(prepared);
      const first = await events.next();
      const mode: GeminiStreamMode = req.query.alt === "sse" ? "sse" : "array";
      const write = mode === "sse" ? startSse(reply) : startJsonStream(reply);
      write(geminiStreamOpen(mode));
      const encoder = new GeminiStreamEncoder(out);
      let sent = 0;
      const send = (chunk: unknown) => write(geminiStreamFrame(chunk, mode, sent++ === 0));
      try {
        for (let next = first; !next.done; next = await events.next()) {
          for (const chunk of encoder.push(next.value)) send(chunk);
        }
        for (const chunk of encoder.end()) send(chunk);
      } catch (err) {
        req.log.warn({ err }, "stream failed");
        const f = await agentFailure(ctx, req, reply, err);
        send(geminiError(f.status, f.message, f.kind));
      }
      reply.raw.end(geminiStreamClose(mode));
    };

    const schema = {
      ...agentSchema("Gemini generateContent, streamGenerateContent, countTokens", `Gemini \`models/{model}:{method}\`; ${MODEL_PATH}.`, GeminiBody),
      params: MethodParams,
      querystring: GeminiQuery,
    };
    for (const version of ["v1beta", "v1"]) {
      app.post<{ Params: Params; Querystring: Query }>(`/s/:sid/${version}/models/*`, { bodyLimit: AGENT_BODY_LIMIT, attachValidation: true, schema }, handler);
    }
  };
}
