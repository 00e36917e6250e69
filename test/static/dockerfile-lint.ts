/**
 * hadolint-style checks we can run without Docker or hadolint: a Dockerfile parser (line
 * continuations, comments, ARG defaults) and the rules our images follow. Each rule names the
 * hadolint rule it mirrors where there is one.
 */

export interface Instruction {
  line: number;
  op: string;
  args: string;
}

export function parseDockerfile(text: string): Instruction[] {
  const out: Instruction[] = [];
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    let raw = lines[i]!;
    if (/^\s*(#|$)/.test(raw)) continue;
    const start = i + 1;
    while (/\\\s*$/.test(raw) && i + 1 < lines.length) {
      i++;
      const next = lines[i]!;
      if (/^\s*#/.test(next)) continue;
      raw = raw.replace(/\\\s*$/, " ") + next.trim();
    }
    const m = /^\s*([A-Za-z]+)\s+([\s\S]*)$/.exec(raw);
    if (m) out.push({ line: start, op: m[1]!.toUpperCase(), args: m[2]!.trim() });
  }
  return out;
}

export interface LintFinding {
  rule: string;
  line: number;
  message: string;
}

const isExecForm = (args: string) => {
  try {
    const v = JSON.parse(args) as unknown;
    return Array.isArray(v) && v.every((x) => typeof x === "string");
  } catch {
    return false;
  }
};

/** Lints one Dockerfile; `composeHealthcheck` says whether compose gives the service one instead. */
export function lintDockerfile(text: string, opts: { composeHealthcheck?: boolean } = {}): LintFinding[] {
  const ins = parseDockerfile(text);
  const findings: LintFinding[] = [];
  const add = (rule: string, line: number, message: string) => findings.push({ rule, line, message });
  const args = new Map<string, string>();
  const stages = new Set<string>();
  const froms = ins.filter((i) => i.op === "FROM");

  for (const i of ins) {
    if (i.op === "ARG") {
      const [name, value] = i.args.split("=", 2);
      if (value !== undefined) args.set(name!.trim(), value.trim());
    }
    if (i.op === "FROM") {
      const parts = i.args.split(/\s+/).filter((p) => !p.startsWith("--"));
      const image = parts[0]!.replace(/\$\{?(\w+)\}?/g, (_m, n: string) => args.get(n) ?? `$${n}`);
      if (parts[1]?.toUpperCase() === "AS" && parts[2]) stages.add(parts[2]);
      if (stages.has(image)) continue; // FROM an earlier stage
      if (image.includes("$")) add("DL3006", i.line, `base image ${parts[0]} uses an ARG without a default`);
      const tag = /^[^@]+:([^:/@]+)$/.exec(image)?.[1];
      if (!tag && !image.includes("@sha256:")) add("DL3006", i.line, `base image ${image} has no explicit tag`);
      if (tag === "latest") add("DL3007", i.line, `base image ${image} uses latest`);
      if (tag && !/\d+\.\d+/.test(tag)) add("RG001", i.line, `base image ${image}: pin at least major.minor (got ${tag})`);
      if (image.startsWith("node:") && tag && !tag.startsWith("22.")) add("RG002", i.line, `node images must be Node 22 LTS (got ${tag})`);
    }
    if (i.op === "COPY") {
      const from = /--from=(\S+)/.exec(i.args)?.[1];
      if (from && !stages.has(from) && !/[:/]/.test(from)) add("DL3022", i.line, `COPY --from=${from} names no earlier stage`);
    }
    if (i.op === "ADD" && !/https?:\/\//.test(i.args)) add("DL3020", i.line, "use COPY, not ADD, for files and folders");
    if (i.op === "WORKDIR" && !i.args.startsWith("/") && !i.args.startsWith("$")) add("DL3000", i.line, "WORKDIR must be absolute");
    if (i.op === "RUN") {
      if (/\bsudo\b/.test(i.args)) add("DL3004", i.line, "do not use sudo");
      if (/\bnpm (install|i)\b/.test(i.args)) add("RG003", i.line, "use npm ci (the lockfile), not npm install");
      if (/\bapt-get install\b/.test(i.args)) {
        if (!/--no-install-recommends/.test(i.args)) add("DL3015", i.line, "apt-get install without --no-install-recommends");
        if (!/rm -rf \/var\/lib\/apt\/lists/.test(i.args)) add("DL3009", i.line, "delete the apt lists after installing");
        if (!/-y\b|--yes\b/.test(i.args)) add("DL3014", i.line, "apt-get install without -y");
      }
      if (/\bapt-get upgrade\b|\bdist-upgrade\b/.test(i.args)) add("DL3005", i.line, "do not upgrade the base image's packages");
      if (/\bcurl\b[^|]*\|\s*(ba)?sh/.test(i.args)) add("DL4006", i.line, "do not pipe curl into a shell");
    }
    if ((i.op === "CMD" || i.op === "ENTRYPOINT") && !isExecForm(i.args)) add("DL3025", i.line, `${i.op} must use the JSON (exec) form`);
    if (i.op === "ENV" && /(SECRET|PASSWORD|API_KEY|TOKEN)\w*=\S/.test(i.args)) add("RG004", i.line, "no secrets baked into ENV");
  }

  if (froms.length < 2) add("RG005", 1, "use a multi-stage build (build stage + slim runtime stage)");
  const lastFrom = ins.lastIndexOf(froms.at(-1)!);
  const final = ins.slice(lastFrom);
  const users = final.filter((i) => i.op === "USER");
  const lastUser = users.at(-1);
  if (!lastUser) add("DL3002", final[0]?.line ?? 1, "the runtime stage never switches to a non-root USER");
  else if (/^(root|0)(:|$)/.test(lastUser.args)) add("DL3002", lastUser.line, "the last USER is root");
  const cmd = final.filter((i) => i.op === "CMD" || i.op === "ENTRYPOINT").at(-1);
  if (!cmd) add("RG006", final[0]?.line ?? 1, "the runtime stage has no CMD");
  else if (lastUser && lastUser.line > cmd.line) add("RG007", lastUser.line, "USER must come before CMD");
  const healthchecks = ins.filter((i) => i.op === "HEALTHCHECK");
  if (healthchecks.length > 1) add("DL3012", healthchecks[1]!.line, "more than one HEALTHCHECK");
  if (healthchecks.length === 0 && !opts.composeHealthcheck) add("RG008", 1, "no HEALTHCHECK here and none in docker-compose.yml");
  for (const h of healthchecks) {
    const body = h.args.replace(/^(--\S+\s+)*/, "");
    if (!/^CMD\s/.test(body) && body !== "NONE") add("RG009", h.line, "HEALTHCHECK must be CMD …");
    else if (body !== "NONE" && !isExecForm(body.slice(4).trim())) add("RG009", h.line, "HEALTHCHECK CMD should use the exec form");
  }
  return findings;
}
