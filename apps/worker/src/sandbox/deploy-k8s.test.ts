/**
 * deploy/k8s against what the kubernetes runtime and the apps need (static: no cluster runs here).
 */
import { readFileSync, readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { GatewayEnv, WorkerEnv, parseEnv } from "@rollgate/protocol";
import yaml from "js-yaml";
import { describe, expect, it } from "vitest";
import { SANDBOX_APP } from "./kubernetes-runtime.js";

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

/** A container's environment as the app sees it: literal env, then envFrom ConfigMaps/Secrets. */
function containerEnv(c: Doc): Record<string, string> {
  const out: Record<string, string> = {};
  for (const from of c.envFrom ?? []) {
    const src = from.configMapRef ? find("ConfigMap", from.configMapRef.name) : find("Secret", from.secretRef.name);
    Object.assign(out, src.data ?? src.stringData);
  }
  for (const e of c.env ?? []) out[e.name] = e.value ?? "from-field";
  return out;
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

  it("lets sandbox pods reach the gateway (and DNS) only, at the URL sessions are given", () => {
    const np = find("NetworkPolicy", "sandboxes-reach-only-the-gateway");
    expect(np.spec.podSelector.matchLabels).toEqual({ "app.kubernetes.io/name": SANDBOX_APP });
    const gw = find("Deployment", "rollgate-gateway");
    expect(np.spec.egress[0].to[0].podSelector.matchLabels).toEqual(gw.spec.template.metadata.labels);
    expect(np.spec.egress[0].ports[0].port).toBe(gw.spec.template.spec.containers[0].ports[0].containerPort);
    const publicUrl = new URL(find("ConfigMap", "rollgate-config").data.ROLLGATE_PUBLIC_URL);
    expect(publicUrl.hostname).toBe("rollgate-gateway.rollgate.svc.cluster.local");
  });

  it("runs Redis with AOF and no eviction", () => {
    const args: string[] = find("StatefulSet", "rollgate-redis").spec.template.spec.containers[0].args;
    expect(args.join(" ")).toMatch(/--appendonly yes.*--maxmemory-policy noeviction/);
  });
});
