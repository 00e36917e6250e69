import { CreateSessionResponse, Session, Trajectory, type CreateSessionRequest, type TrajectoryBuilderName } from "@rollgate/protocol";
import { request } from "undici";
import type { z } from "zod";

/** A failure to talk to the gateway: infrastructure, so the rollout is retried. */
export class GatewayUnavailable extends Error {}

/** The worker's view of the gateway's session API (workers never touch engines directly). */
export class GatewayClient {
  constructor(
    private readonly baseUrl: string,
    private readonly apiKey: string | undefined,
  ) {}

  private async call<S extends z.ZodType>(method: "GET" | "POST", path: string, schema: S, body?: unknown): Promise<z.infer<S>> {
    let res;
    try {
      res = await request(`${this.baseUrl}${path}`, {
        method,
        headers: {
          ...(body !== undefined ? { "content-type": "application/json" } : {}),
          ...(this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {}),
        },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
        headersTimeout: 60_000,
        bodyTimeout: 120_000,
      });
    } catch (err) {
      throw new GatewayUnavailable(`gateway ${this.baseUrl} unreachable: ${(err as Error).message}`);
    }
    const text = await res.body.text();
    if (res.statusCode >= 300) {
      throw new GatewayUnavailable(`${method} ${path} answered ${res.statusCode}: ${text.slice(0, 500)}`);
    }
    return schema.parse(JSON.parse(text));
  }

  openSession(req: Partial<CreateSessionRequest>) {
    return this.call("POST", "/v1/sessions", CreateSessionResponse, req);
  }
  closeSession(id: string) {
    return this.call("POST", `/v1/sessions/${encodeURIComponent(id)}/close`, Session);
  }
  session(id: string) {
    return this.call("GET", `/v1/sessions/${encodeURIComponent(id)}`, Session);
  }
  trajectory(id: string, builder: TrajectoryBuilderName) {
    return this.call("GET", `/v1/sessions/${encodeURIComponent(id)}/trajectory?builder=${builder}`, Trajectory);
  }
}
