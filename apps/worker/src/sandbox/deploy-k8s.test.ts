/**
 * deploy/k8s against what the kubernetes runtime and the apps need (static: no cluster runs here).
 */
import { readFileSync, readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseEnv } from "@rollgate/config";
import { GatewayEnv } from "@rollgate/gateway/env";
import yaml from "js-yaml";
import { describe, expect, it } from "vitest";
import { SANDBOX_APP } from "./kubernetes-runtime.js";
import { WorkerEnv } from "../env.js";

const dir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../../deploy/k8s");
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Doc = any;
const docs: Doc[] = readdirSync(dir)
  .filter((f) => f.endsWith(".yaml") && f !== "kustomization.yaml")
  .flatMap((f) => yaml.loadAll(readFileSync(path.join(dir, f), "utf8")) as Doc[]);
const find = (kind: string, name: string): Doc => {
  const d = docs.find((x) => x.kind === kind && x.metadata.name === name);
  if (!d) throw new Error(`no ${kind}/${name} in deploy/k8s`);
  return d;
};

/** A container's environment as the app sees it: envFrom ConfigMaps/Secrets, then env (Secret refs read, $(VAR) expanded as the kubelet does). */
function containerEnv(c: Doc): Record<string, string> {
  const out: Record<string, string> = {};
  for (const from of c.envFrom ?? []) {
    const src = from.configMapRef ? find("ConfigMap", from.configMapRef.name) : find("Secret", from.secretRef.name);
    Object.assign(out, src.data ?? src.stringData);
  }
  for (const e of c.env ?? []) {
    const ref = e.valueFrom?.secretKeyRef;
    out[e.name] = ref ? find("Secret", ref.name).stringData[ref.key] : e.value !== undefined ? String(e.value).replace(/\$\(([A-Z_]+)\)/g, (_m: string, k: string) => out[k] ?? "") : "from-field";
  }
  return out;
}

/** The ACL rules given to rollgate's Redis user on a redis-server command line (after `--user rollgate on >password`). */
function aclRules(args: string[]): { password: string; rules: string[]; defaultOff: boolean } {
  const at = args.findIndex((a, i) => a === "--user" && args[i + 1] === "rollgate");
  const end = args.findIndex((a, i) => i > at && a.startsWith("--"));
  const user = args.slice(at + 2, end < 0 ? undefined : end);
  const d = args.findIndex((a, i) => a === "--user" && args[i + 1] === "default");
  return { password: user.find((r) => r.startsWith(">"))!, rules: user.filter((r) => !r.startsWith(">")), defaultOff: d >= 0 && args[d + 2] === "off" };
}

describe("deploy/k8s", () => {
  it("lists every manifest in its kustomization", () => {
    const k = yaml.load(readFileSync(path.join(dir, "kustomization.yaml"), "utf8")) as { resources: string[] };
    expect(k.resources.sort()).toEqual(readdirSync(dir).filter((f) => f.endsWith(".yaml") && f !== "kustomization.yaml").sort());
  });

  it("runs 2 gateway replicas behind a Service, with a valid gateway environment", () => {
    const gw = find("Deployment", "rollgate-gateway");
    expect(gw.spec.replicas).toBe(2);
    expect(find("Service", "rollgate-gateway").spec.selector).toEqual(gw.spec.template.metadata.labels);
    expect(() => parseEnv(GatewayEnv, containerEnv(gw.spec.template.spec.containers[0]))).not.toThrow();
  });

  it("gives the worker a valid environment with the kubernetes runtime, and rights in the sandbox namespace only", () => {
    const w = find("Deployment", "rollgate-worker").spec.template.spec;
    const env = parseEnv(WorkerEnv, containerEnv(w.containers[0]));
    expect(env.ROLLGATE_RUNTIMES).toEqual(["kubernetes"]);
    const role = find("Role", "rollgate-sandbox-manager");
    expect(role.metadata.namespace).toBe(env.ROLLGATE_K8S_NAMESPACE);
    const verbs = (res: string) => role.rules.find((r: Doc) => r.resources.includes(res))?.verbs ?? [];
    expect(verbs("pods")).toEqual(expect.arrayContaining(["create", "get", "list", "delete"]));
    expect(verbs("pods/exec")).toEqual(expect.arrayContaining(["create", "get"]));
    expect(verbs("secrets")).toEqual(expect.arrayContaining(["create", "list", "delete"]));
    const binding = find("RoleBinding", "rollgate-worker-sandboxes");
    expect(binding.metadata.namespace).toBe(env.ROLLGATE_K8S_NAMESPACE);
    expect(binding.subjects).toEqual([{ kind: "ServiceAccount", name: w.serviceAccountName, namespace: "rollgate" }]);
    expect(docs.some((d) => d.kind === "ClusterRole" || d.kind === "ClusterRoleBinding")).toBe(false);
  });

  it("lets sandbox pods reach the gateway's port and DNS only — not Redis, the engines, each other or any address — and nothing reach them", () => {
    const np = find("NetworkPolicy", "sandboxes-reach-only-the-gateway");
    expect(np.metadata.namespace).toBe("rollgate-sandboxes");
    expect(np.spec.podSelector.matchLabels).toEqual({ "app.kubernetes.io/name": SANDBOX_APP });
    expect(np.spec.policyTypes.sort()).toEqual(["Egress", "Ingress"]);
    expect(np.spec.ingress).toEqual([]);
    const gw = find("Deployment", "rollgate-gateway");
    expect(np.spec.egress).toHaveLength(2);
    const [toGateway, toDns] = np.spec.egress;
    expect(toGateway.to).toEqual([{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "rollgate" } }, podSelector: { matchLabels: gw.spec.template.metadata.labels } }]);
    expect(toGateway.ports).toEqual([{ protocol: "TCP", port: gw.spec.template.spec.containers[0].ports[0].containerPort }]);
    expect(toDns.to).toEqual([{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "kube-system" } }, podSelector: { matchLabels: { "k8s-app": "kube-dns" } } }]);
    expect(toDns.ports.map((p: Doc) => p.port)).toEqual([53, 53]);
    // No address block anywhere: no metadata endpoint, no node, no API server.
    expect(JSON.stringify(np)).not.toContain("ipBlock");
    const publicUrl = new URL(find("ConfigMap", "rollgate-config").data.ROLLGATE_PUBLIC_URL);
    expect(publicUrl.hostname).toBe("rollgate-gateway.rollgate.svc.cluster.local");
    expect(Number(publicUrl.port)).toBe(toGateway.ports[0].port);
  });

  it("makes the gateway require the API key: sandboxes reach its port, so its trainer and admin routes must not be open", () => {
    const c = find("Deployment", "rollgate-gateway").spec.template.spec.containers[0];
    const ref = c.envFrom.find((f: Doc) => f.secretRef)?.secretRef;
    expect(ref).toEqual({ name: "rollgate-api-key" });
    expect(ref.optional).toBeUndefined();
    expect(parseEnv(GatewayEnv, containerEnv(c)).ROLLGATE_API_KEY).toBeTruthy();
  });

  it("gives the worker the rights for a pod's own egress policy in the sandbox namespace", () => {
    const rules = find("Role", "rollgate-sandbox-manager").rules;
    expect(rules.find((r: Doc) => r.resources.includes("networkpolicies"))).toEqual({ apiGroups: ["networking.k8s.io"], resources: ["networkpolicies"], verbs: ["create", "get", "delete"] });
  });

  it("runs Redis with AOF and no eviction", () => {
    const args: string[] = find("StatefulSet", "rollgate-redis").spec.template.spec.containers[0].args;
    expect(args.join(" ")).toMatch(/--appendonly yes.*--maxmemory-policy noeviction/);
  });

  it("gives Redis a password: no password-less user, rollgate's ACL user (as in docker-compose.yml) in the apps' REDIS_URL, and only the apps may connect", () => {
    const redis = find("StatefulSet", "rollgate-redis").spec.template.spec.containers[0];
    const acl = aclRules(redis.args);
    expect(acl.defaultOff).toBe(true);
    expect(acl.password).toBe(">$(REDIS_PASSWORD)");
    expect(acl.rules).toEqual(["on", "~rg:*", "~{rg:*", "&rg:*", "+@all", "-@dangerous", "+info", "+client|list"]);
    const password = containerEnv(redis).REDIS_PASSWORD;
    expect(password).toBeTruthy();
    for (const app of ["rollgate-gateway", "rollgate-worker"]) {
      const env = containerEnv(find("Deployment", app).spec.template.spec.containers[0]);
      const url = new URL(env.REDIS_URL!);
      expect([url.username, url.password], app).toEqual(["rollgate", password]);
      expect(url.hostname).toBe("rollgate-redis-0.rollgate-redis.rollgate.svc.cluster.local");
      expect(env.ROLLGATE_KEY_PREFIX).toBe("rg");
    }
    expect(find("ConfigMap", "rollgate-config").data.REDIS_URL).toBeUndefined();
    expect(redis.readinessProbe.exec.command.join(" ")).toMatch(/redis-cli .*--user rollgate --pass "\$REDIS_PASSWORD" ping/);
    const np = find("NetworkPolicy", "redis-only-from-rollgate");
    expect(np.spec.podSelector.matchLabels).toEqual(find("StatefulSet", "rollgate-redis").spec.template.metadata.labels);
    expect(np.spec.ingress[0].from.map((f: Doc) => f.podSelector.matchLabels["app.kubernetes.io/name"]).sort()).toEqual(["rollgate-gateway", "rollgate-worker"]);
    expect(np.spec.ingress[0].ports).toEqual([{ protocol: "TCP", port: 6379 }]);
  });
});
