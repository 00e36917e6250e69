import { resolveProfile } from "@rollgate/models";
import { GatewayEnv, parseEnv } from "@rollgate/protocol";

/** The gateway's environment: GatewayEnv, with each engine's model profile checked against the presets. */
const GatewayEnvWithProfiles = GatewayEnv.extend({
  ROLLGATE_ENGINES: GatewayEnv.shape.ROLLGATE_ENGINES.superRefine((engines, ctx) => {
    engines.forEach((e, i) => {
      const r = resolveProfile(e.profile, e.vocab_size);
      if (!r.ok) for (const message of r.issues) ctx.addIssue({ code: "custom", path: [i, "profile"], message });
    });
  }),
});

export function loadGatewayEnv(env: Record<string, string | undefined> = process.env): GatewayEnv {
  return parseEnv(GatewayEnvWithProfiles, env);
}
