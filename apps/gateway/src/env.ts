import { GatewayEnv, parseEnv } from "@rollgate/protocol";

export function loadGatewayEnv(env: Record<string, string | undefined> = process.env): GatewayEnv {
  return parseEnv(GatewayEnv, env);
}
