/** A small JSON client for the trainer API (with `apiKey`, sent as `Authorization: Bearer`). */
export function apiClient(base: () => string, apiKey?: string) {
  return async function api(path: string, init: { method?: string; body?: unknown; raw?: string } = {}) {
    const hasBody = init.body !== undefined || init.raw !== undefined;
    const res = await fetch(`${base()}${path}`, {
      method: init.method ?? (hasBody ? "POST" : "GET"),
      headers: { ...(hasBody ? { "content-type": "application/json" } : {}), ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) },
      ...(init.raw !== undefined ? { body: init.raw } : init.body !== undefined ? { body: JSON.stringify(init.body) } : {}),
    });
    const text = await res.text();
    let body: unknown = text;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      // not JSON (logs)
    }
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    return { status: res.status, body: body as any, headers: res.headers };
  };
}
