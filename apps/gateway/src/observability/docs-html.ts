/**
 * A self-contained HTML rendering of the OpenAPI document (`GET /docs`): no script, no CDN, no
 * external asset, so it works on offline machines. Operations grouped by tag, each with its
 * parameters, request body and responses; schemas as collapsible JSON with `$ref`s as links.
 */

type Json = Record<string, unknown>;

const METHODS = ["get", "post", "put", "patch", "delete"] as const;

function esc(s: unknown): string {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}

/** Inline markdown: `code` only. */
function md(s: unknown): string {
  return esc(s ?? "").replace(/`([^`]+)`/g, "<code>$1</code>");
}

const anchor = (name: string) => `schema-${name.replace(/[^A-Za-z0-9_-]/g, "_")}`;

function refName(ref: string): string {
  return ref.replace("#/components/schemas/", "");
}

/** A schema in one line: a link for a `$ref`, else its type. */
function schemaSummary(schema: Json | undefined): string {
  if (!schema) return "";
  if (typeof schema.$ref === "string") {
    const name = refName(schema.$ref);
    return `<a href="#${anchor(name)}">${esc(name)}</a>`;
  }
  if (Array.isArray(schema.oneOf)) return (schema.oneOf as Json[]).map(schemaSummary).join(" | ");
  if (schema.enum) return `${esc(schema.type ?? "")} (${(schema.enum as unknown[]).map(esc).join(" | ")})`;
  const type = Array.isArray(schema.type) ? schema.type.join(" | ") : (schema.type ?? "any");
  if (type === "array" && schema.items) return `array of ${schemaSummary(schema.items as Json)}`;
  if (type === "object" && schema.additionalProperties === true && !schema.properties) return "object (open)";
  return esc(type);
}

/** Pretty JSON with every `$ref` turned into a link to its schema. */
function jsonWithLinks(value: unknown): string {
  return esc(JSON.stringify(value, null, 2)).replace(
    /(&quot;\$ref&quot;: &quot;)#\/components\/schemas\/([^&]+)(&quot;)/g,
    (_m, pre: string, name: string, post: string) => `${pre}<a href="#${anchor(name)}">#/components/schemas/${name}</a>${post}`,
  );
}

function renderContent(content: Json | undefined): string {
  if (!content) return "";
  return Object.entries(content)
    .map(([type, c]) => `<span class="ct">${esc(type)}</span> ${schemaSummary((c as Json).schema as Json)}`)
    .join("<br>");
}

function renderOperation(method: string, path: string, op: Json): string {
  const params = (op.parameters ?? []) as Json[];
  const body = op.requestBody as Json | undefined;
  const responses = (op.responses ?? {}) as Record<string, Json>;
  const security = ((op.security ?? []) as Json[]).flatMap((s) => Object.keys(s));
  return `<section class="op" id="${esc(`${method}-${path}`)}">
<h3><span class="m m-${method}">${method.toUpperCase()}</span> <code>${esc(path)}</code> <span class="sum">${md(op.summary)}</span></h3>
${op.description ? `<p>${md(op.description)}</p>` : ""}
${security.length ? `<p class="auth">auth: ${security.map((s) => `<code>${esc(s)}</code>`).join(" or ")}</p>` : `<p class="auth">no auth</p>`}
${
  params.length
    ? `<table><tr><th>parameter</th><th>in</th><th>schema</th><th></th></tr>${params
        .map(
          (p) =>
            `<tr><td><code>${esc(p.name)}</code>${p.required ? " *" : ""}</td><td>${esc(p.in)}</td><td>${schemaSummary(p.schema as Json)}</td><td>${md(p.description ?? "")}</td></tr>`,
        )
        .join("")}</table>`
    : ""
}
${body ? `<p><b>body</b>${body.required ? "" : " (optional)"}: ${renderContent(body.content as Json)}</p>` : ""}
<table><tr><th>status</th><th>meaning</th><th>body</th></tr>${Object.entries(responses)
    .map(([code, r]) => `<tr><td>${esc(code)}</td><td>${md(r.description)}</td><td>${renderContent(r.content as Json)}</td></tr>`)
    .join("")}</table>
</section>`;
}

export function renderDocsHtml(doc: Json): string {
  const info = doc.info as Json;
  const paths = doc.paths as Record<string, Json>;
  const tags = (doc.tags ?? []) as Json[];
  const schemas = ((doc.components as Json).schemas ?? {}) as Record<string, Json>;
  const byTag = new Map<string, string[]>();
  const toc = new Map<string, string[]>();
  for (const [path, item] of Object.entries(paths)) {
    for (const method of METHODS) {
      const op = item[method] as Json | undefined;
      if (!op) continue;
      const tag = ((op.tags as string[] | undefined) ?? ["other"])[0]!;
      if (!byTag.has(tag)) {
        byTag.set(tag, []);
        toc.set(tag, []);
      }
      byTag.get(tag)!.push(renderOperation(method, path, op));
      toc.get(tag)!.push(`<li><a href="#${esc(`${method}-${path}`)}"><span class="m m-${method}">${method.toUpperCase()}</span> ${esc(path)}</a></li>`);
    }
  }
  const tagText = new Map(tags.map((t) => [String(t.name), String(t.description ?? "")]));
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${esc(info.title)} API</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d2330;background:#f7f8fa}
main{max-width:1100px;margin:0 auto;padding:24px}
nav{background:#fff;border:1px solid #e3e6ec;border-radius:8px;padding:12px 20px;margin-bottom:24px}
nav ul{list-style:none;padding-left:0;columns:2}
h1{margin:0 0 4px} h2{margin-top:36px;border-bottom:2px solid #e3e6ec;padding-bottom:4px}
.op{background:#fff;border:1px solid #e3e6ec;border-radius:8px;padding:4px 16px 12px;margin:12px 0}
.op h3{font-size:15px} .sum{font-weight:normal;color:#505a6b}
.m{display:inline-block;min-width:52px;text-align:center;border-radius:4px;color:#fff;font:bold 12px monospace;padding:2px 4px}
.m-get{background:#2f7dd1}.m-post{background:#2e9d5b}.m-delete{background:#c94242}.m-put,.m-patch{background:#b8860b}
table{border-collapse:collapse;margin:6px 0;width:100%} th,td{border-bottom:1px solid #eef0f4;text-align:left;padding:4px 8px;vertical-align:top}
th{font-weight:600;color:#505a6b} .ct{color:#7a8394;font-size:12px} .auth{color:#505a6b;font-size:13px}
code{background:#f0f2f6;border-radius:3px;padding:0 3px} pre{background:#f0f2f6;padding:10px;overflow:auto;font-size:12px}
details{background:#fff;border:1px solid #e3e6ec;border-radius:8px;margin:8px 0;padding:6px 12px} summary{cursor:pointer;font-weight:600}
a{color:#2f6fb8;text-decoration:none} a:hover{text-decoration:underline}
</style></head>
<body><main>
<h1>${esc(info.title)} <small>OpenAPI ${esc(doc.openapi)}</small></h1>
<p>${md(info.description)}</p>
<p>Machine-readable: <a href="docs/openapi.json">openapi.json</a></p>
<nav>${[...toc.entries()].map(([tag, items]) => `<b>${esc(tag)}</b><ul>${items.join("")}</ul>`).join("")}<b>schemas</b><ul>${Object.keys(schemas)
    .map((n) => `<li><a href="#${anchor(n)}">${esc(n)}</a></li>`)
    .join("")}</ul></nav>
${[...byTag.entries()].map(([tag, ops]) => `<h2>${esc(tag)}</h2><p>${md(tagText.get(tag) ?? "")}</p>${ops.join("\n")}`).join("\n")}
<h2>schemas</h2>
${Object.entries(schemas)
  .map(([name, s]) => `<details id="${anchor(name)}"><summary>${esc(name)}</summary>${s.description ? `<p>${md(s.description)}</p>` : ""}<pre>${jsonWithLinks(s)}</pre></details>`)
  .join("\n")}
</main></body></html>`;
}
