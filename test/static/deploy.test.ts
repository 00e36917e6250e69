/**
 * docker-compose.yml, the Dockerfiles and the load balancer's config, checked statically (no
 * Docker engine runs here): the compose file is parsed with `yaml`, its variables are interpolated
 * the way Compose does, every app's environment is validated with the app's own zod schema, and
 * the Dockerfiles pass hadolint-style rules (./dockerfile-lint.ts). The real run is in the README.
 */
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { parseEnv } from "@rollgate/config";
import { EngineSimEnv } from "@rollgate/engine-sim/env";
import { GatewayEnv } from "@rollgate/gateway/env";
import { WorkerEnv } from "@rollgate/worker/env";
import { describe, expect, it } from "vitest";
import { parse } from "yaml";
import { REPO_ROOT } from "../support/cluster.js";
import { lintDockerfile, parseDockerfile } from "./dockerfile-lint.js";

const read = (p: string) => readFileSync(path.join(REPO_ROOT, p), "utf8");

/** Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, $$ → $. */
function interpolate(value: unknown, vars: Record<string, string>): unknown {
  if (typeof value === "string") {
    return value
      .replace(/\$\{(\w+)(?:(:?[-?])([^}]*))?\}/g, (_m, name: string, op: string | undefined, arg: string | undefined) => {
        const v = vars[name];
        if (op === ":-") return v ? v : (arg ?? "");
        if (op === "-") return v !== undefined ? v : (arg ?? "");
        if ((op === ":?" && !v) || (op === "?" && v === undefined)) throw new Error(`required variable ${name} is missing a value: ${arg}`);
        return v ?? "";
      })
      .replace(/\$\$/g, "$");
  }
  if (Array.isArray(value)) return value.map((v) => interpolate(v, vars));
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, interpolate(v, vars)]));
  return value;
}

function readEnvFile(p: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of read(p).split("\n")) {
    const m = /^\s*([A-Za-z_]\w*)=(.*)$/.exec(line);
    if (m) out[m[1]!] = m[2]!.trim();
  }
  return out;
}

interface Service {
  image?: string;
  build?: { context: string; dockerfile: string };
  command?: string[];
  environment?: Record<string, string>;
  healthcheck?: { test: string[]; interval?: string };
  depends_on?: Record<string, { condition: string; required?: boolean }>;
  profiles?: string[];
  ports?: string[];
  container_name?: string;
  deploy?: { replicas?: number; resources?: { reservations?: { devices?: { driver: string; capabilities: string[] }[] } } };
  volumes?: string[];
}

/** A password as README says to make one (hex: URL-safe). */
const REDIS_PASSWORD = "0123456789abcdef0123456789abcdef";

function compose(vars: Record<string, string> = { REDIS_PASSWORD }): { services: Record<string, Service>; volumes: Record<string, unknown> } {
  return interpolate(parse(read("docker-compose.yml"), { merge: true }), vars) as never;
}

/**
 * The services Compose runs with these profiles active, as Compose decides it: a service with
 * profiles runs only when one is active; a dependency on a service that does not run is an error,
 * unless the dependency says `required: false` (then it is skipped).
 */
function activeServices(services: Record<string, Service>, profiles: string[]): Record<string, Service> {
  const active = Object.fromEntries(Object.entries(services).filter(([, s]) => !s.profiles || s.profiles.some((p) => profiles.includes(p))));
  for (const [name, s] of Object.entries(active)) {
    for (const [dep, cond] of Object.entries(s.depends_on ?? {})) {
      if (!active[dep] && cond.required !== false) throw new Error(`service ${name} depends on ${dep}, which does not run with profiles [${profiles.join(", ")}]`);
    }
  }
  return active;
}

const APP_DOCKERFILES = { gateway: "apps/gateway/Dockerfile", worker: "apps/worker/Dockerfile", "engine-sim": "apps/engine-sim/Dockerfile" };

describe("docker-compose.yml", () => {
  const { services, volumes } = compose();

  it("has the services the local cluster needs, and the vLLM one only in the gpu profile", () => {
    expect(Object.keys(services).sort()).toEqual(["engine-sim", "gateway-1", "gateway-2", "lb", "redis", "vllm", "worker"]);
    for (const [name, s] of Object.entries(services)) expect(s.profiles, name).toEqual(name === "vllm" ? ["gpu"] : undefined);
  });

  it("runs Redis with AOF persistence and noeviction, on a volume", () => {
    const cmd = services.redis!.command!.join(" ");
    expect(cmd).toContain("--appendonly yes");
    expect(cmd).toContain("--maxmemory-policy noeviction");
    expect(services.redis!.volumes).toContain("redis-data:/data");
    expect(volumes).toHaveProperty("redis-data");
  });

  it("gives Redis a password: no password-less user, rollgate's ACL user limited to its keys and no dangerous command, and no start without REDIS_PASSWORD", () => {
    const cmd = services.redis!.command!;
    const at = cmd.findIndex((a, i) => a === "--user" && cmd[i + 1] === "rollgate");
    expect(cmd.slice(at)).toEqual(["--user", "rollgate", "on", `>${REDIS_PASSWORD}`, "~rg:*", "~{rg:*", "&rg:*", "+@all", "-@dangerous", "+info", "+client|list"]);
    const d = cmd.findIndex((a, i) => a === "--user" && cmd[i + 1] === "default");
    expect(cmd.slice(d, d + 3)).toEqual(["--user", "default", "off"]);
    // The key prefix the ACL allows is the one the apps use.
    expect(services["gateway-1"]!.environment!.ROLLGATE_KEY_PREFIX).toBe("rg");
    expect(services.worker!.environment!.ROLLGATE_KEY_PREFIX).toBe("rg");
    expect(services.redis!.healthcheck!.test).toEqual(["CMD", "redis-cli", "--no-auth-warning", "--user", "rollgate", "--pass", REDIS_PASSWORD, "ping"]);
    expect(() => compose({})).toThrow(/REDIS_PASSWORD/);
  });

  it("gives every service a health check, and orders start-up on health", () => {
    for (const [name, s] of Object.entries(services)) {
      expect(s.healthcheck?.test?.[0], `${name} healthcheck`).toMatch(/^CMD(-SHELL)?$/);
      for (const [dep, cond] of Object.entries(s.depends_on ?? {})) {
        expect(services[dep], `${name} depends on ${dep}`).toBeDefined();
        expect(cond.condition, `${name} → ${dep}`).toBe("service_healthy");
      }
    }
    expect(Object.keys(services.lb!.depends_on!).sort()).toEqual(["gateway-1", "gateway-2"]);
  });

  it("pins every image (no latest) and builds the apps from their own Dockerfiles", () => {
    for (const [name, s] of Object.entries(services)) {
      if (s.image && !s.build) {
        const tag = /:([^:/]+)$/.exec(s.image)?.[1];
        expect(tag, `${name}: ${s.image}`).toMatch(/\d+\.\d+/);
        expect(tag).not.toBe("latest");
      }
      if (s.build) {
        expect(s.build.context).toBe(".");
        expect(existsSync(path.join(REPO_ROOT, s.build.dockerfile)), s.build.dockerfile).toBe(true);
      }
    }
    expect(services["gateway-1"]!.build!.dockerfile).toBe(APP_DOCKERFILES.gateway);
    expect(services.worker!.build!.dockerfile).toBe(APP_DOCKERFILES.worker);
    expect(services["engine-sim"]!.build!.dockerfile).toBe(APP_DOCKERFILES["engine-sim"]);
    expect(existsSync(path.join(REPO_ROOT, "Dockerfile")), "the root first-cut Dockerfile is replaced by per-app ones").toBe(false);
  });

  it("gives the gateways, workers and engine-sim environments their own schemas accept", () => {
    const known = (shape: object, env: Record<string, string>, who: string) => {
      for (const k of Object.keys(env)) expect(Object.keys(shape), `${who}: unknown variable ${k}`).toContain(k);
    };
    for (const g of ["gateway-1", "gateway-2"]) {
      const env = services[g]!.environment!;
      known(GatewayEnv.shape, env, g);
      const parsed = parseEnv(GatewayEnv, env);
      expect(parsed.HOST).toBe("0.0.0.0");
      expect(parsed.REDIS_URL).toBe(`redis://rollgate:${REDIS_PASSWORD}@redis:6379`);
      expect(parsed.ROLLGATE_PUBLIC_URL).toBe("http://lb:8080");
      expect(parsed.ROLLGATE_ENGINES).toEqual([{ kind: "vllm", url: "http://engine-sim:8000", dp_size: 4, profile: "qwen3" }]);
      expect(services[g]!.ports, "only the load balancer is published").toBeUndefined();
    }
    const worker = services.worker!.environment!;
    known(WorkerEnv.shape, worker, "worker");
    expect(parseEnv(WorkerEnv, worker).ROLLGATE_GATEWAY_URL).toBe("http://lb:8080");
    expect(parseEnv(WorkerEnv, worker).REDIS_URL).toBe(`redis://rollgate:${REDIS_PASSWORD}@redis:6379`);
    const sim = services["engine-sim"]!.environment!;
    known(EngineSimEnv.shape, sim, "engine-sim");
    parseEnv(EngineSimEnv, sim);
  });

  it("runs engine-sim with as many DP ranks as the gateways route to (several)", () => {
    const cmd = services["engine-sim"]!.command!;
    const dp = Number(cmd[cmd.indexOf("--dp") + 1]);
    expect(dp).toBeGreaterThanOrEqual(2);
    expect(parseEnv(GatewayEnv, services["gateway-1"]!.environment!).ROLLGATE_ENGINES[0]!.dp_size).toBe(dp);
    expect(cmd).toContain("0.0.0.0");
  });

  it("lets workers scale with --scale (no fixed name or port) and stop gracefully", () => {
    const w = services.worker!;
    expect(w.container_name).toBeUndefined();
    expect(w.ports).toBeUndefined();
    expect(w.deploy?.replicas).toBeGreaterThanOrEqual(1);
    expect((w as { stop_grace_period?: string }).stop_grace_period).toMatch(/^\d+s$/);
  });

  it("runs a real vLLM in the gpu profile with the flags the vLLM adapter needs, and deploy/gpu.env points the gateways at it", () => {
    const v = services.vllm!;
    const [, version] = /^vllm\/vllm-openai:v(\d+\.\d+\.\d+)$/.exec(v.image!) ?? [];
    expect(version, v.image).toBeDefined();
    const [maj, min, patch] = version!.split(".").map(Number) as [number, number, number];
    // return_token_ids needs vLLM >= 0.10.2.
    expect(maj * 1e6 + min * 1e3 + patch).toBeGreaterThanOrEqual(10_002);
    const cmd = v.command!.join(" ");
    expect(cmd).toContain("--enable-auto-tool-choice");
    expect(cmd).toContain("--tool-call-parser=hermes");
    expect(cmd).toContain("--reasoning-parser=qwen3");
    expect(cmd).toMatch(/--model=Qwen\/Qwen3-/);
    expect(v.deploy?.resources?.reservations?.devices?.[0]).toMatchObject({ driver: "nvidia", capabilities: ["gpu"] });

    const gpuVars = readEnvFile("deploy/gpu.env");
    expect(gpuVars.COMPOSE_PROFILES).toBe("gpu");
    const gpu = compose({ ...gpuVars, REDIS_PASSWORD });
    const engines = parseEnv(GatewayEnv, gpu.services["gateway-1"]!.environment!).ROLLGATE_ENGINES;
    expect(engines).toEqual([{ kind: "vllm", url: "http://vllm:8000", dp_size: Number(gpuVars.VLLM_DP_SIZE), profile: gpuVars.ROLLGATE_ENGINE_PROFILE }]);
    expect(gpuVars.VLLM_MODEL).toMatch(/^Qwen\/Qwen3-/);
    expect(gpuVars.ROLLGATE_ENGINE_PROFILE).toBe("qwen3");
    expect(gpu.services.vllm!.command).toContain(`--data-parallel-size=${gpuVars.VLLM_DP_SIZE}`);
  });

  it("in the gpu profile, starts the gateways only once vLLM is healthy; without it, runs without vLLM", () => {
    const gpuVars = readEnvFile("deploy/gpu.env");
    const gpu = activeServices(compose({ ...gpuVars, REDIS_PASSWORD }).services, gpuVars.COMPOSE_PROFILES!.split(","));
    expect(gpu.vllm).toBeDefined();
    expect(gpu.vllm!.healthcheck!.test.join(" ")).toContain("http://127.0.0.1:8000/health");
    // vLLM loads its weights before /health answers: the health check waits that long before counting failures.
    expect(Number(/^(\d+)s$/.exec((gpu.vllm!.healthcheck as { start_period?: string }).start_period ?? "")?.[1])).toBeGreaterThanOrEqual(300);
    for (const g of ["gateway-1", "gateway-2"]) expect(gpu[g]!.depends_on!.vllm).toMatchObject({ condition: "service_healthy" });
    // The load balancer and the workers wait for healthy gateways, and a gateway is healthy only when /readyz says it can serve.
    expect(gpu.lb!.depends_on).toMatchObject({ "gateway-1": { condition: "service_healthy" }, "gateway-2": { condition: "service_healthy" } });
    expect(gpu["gateway-1"]!.healthcheck!.test.join(" ")).toContain("/readyz");

    const plain = activeServices(compose().services, []);
    expect(plain.vllm).toBeUndefined();
    expect(plain["gateway-1"]!.depends_on!.vllm).toMatchObject({ required: false });
    expect(() => activeServices({ a: { depends_on: { b: { condition: "service_healthy" } } }, b: { profiles: ["x"] } }, [])).toThrow(/a depends on b/);
  });

  it("puts an nginx load balancer in front of both gateways, tuned for SSE and long agent calls", () => {
    const lb = services.lb!;
    const mount = lb.volumes!.find((v) => v.endsWith(":/etc/nginx/nginx.conf:ro"))!;
    const conf = read(mount.split(":")[0]!.replace(/^\.\//, ""));
    expect(conf).toMatch(/server gateway-1:8080/);
    expect(conf).toMatch(/server gateway-2:8080/);
    expect(conf).toMatch(/proxy_buffering off;/);
    expect(conf).toMatch(/proxy_read_timeout \d{3,}s;/);
    expect(conf).toMatch(/proxy_http_version 1\.1;/);
    // Balanced braces: a syntax slip would stop nginx.
    expect(conf.split("{").length).toBe(conf.split("}").length);
    expect(lb.ports).toEqual(["8080:8080"]);
  });
});

describe("Dockerfiles (hadolint-style rules)", () => {
  const { services } = compose();
  for (const [app, file] of Object.entries(APP_DOCKERFILES)) {
    it(`${file} passes`, () => {
      const text = read(file);
      const hasComposeHealthcheck = Object.values(services).some((s) => s.build?.dockerfile === file && s.healthcheck);
      expect(lintDockerfile(text, { composeHealthcheck: hasComposeHealthcheck })).toEqual([]);
      const ins = parseDockerfile(text);
      // Builds with the lockfile and starts the app's own entry point.
      expect(ins.some((i) => i.op === "RUN" && i.args.includes("npm ci"))).toBe(true);
      expect(ins.filter((i) => i.op === "CMD").at(-1)!.args).toContain(`apps/${app}/dist/main.js`);
      // Every local path it copies exists (the context is the repository root).
      for (const i of ins.filter((x) => x.op === "COPY" && !x.args.includes("--from"))) {
        const parts = i.args.split(/\s+/).filter((p) => !p.startsWith("--"));
        for (const src of parts.slice(0, -1)) expect(existsSync(path.join(REPO_ROOT, src)), `${file}:${i.line} ${src}`).toBe(true);
      }
    });
  }

  it("the linter catches what it claims to", () => {
    const bad = `FROM node:latest\nWORKDIR app\nRUN npm install && apt-get install curl\nADD . /app\nCMD node main.js\n`;
    const rules = lintDockerfile(bad).map((f) => f.rule);
    for (const r of ["DL3007", "RG001", "DL3000", "RG003", "DL3015", "DL3009", "DL3020", "DL3025", "RG005", "DL3002", "RG008"]) expect(rules).toContain(r);
    const root = `FROM node:22.1.0 AS a\nFROM node:22.1.0\nUSER root\nHEALTHCHECK CMD ["true"]\nCMD ["node"]\n`;
    expect(lintDockerfile(root).map((f) => f.rule)).toEqual(["DL3002"]);
  });

  it(".dockerignore keeps node_modules, build output and git out of the context", () => {
    const ignore = read(".dockerignore").split("\n").map((l) => l.trim());
    for (const p of ["**/node_modules", "**/dist", ".git"]) expect(ignore).toContain(p);
  });
});
