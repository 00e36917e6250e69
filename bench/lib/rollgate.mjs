// Talking to a running gateway: the session and task APIs, plain fetch (loopback only).

/**
 * @param {string} base
 * @param {string} route
 * @param {{ method?: string, body?: unknown }} options
 * @returns {Promise<unknown>} the parsed JSON answer
 */
export async function api(base, route, { method = "GET", body } = {}) {
  const res = await fetch(`${base}${route}`, {
    method: body !== undefined && method === "GET" ? "POST" : method,
    headers: body !== undefined ? { "content-type": "application/json" } : {},
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = text;
  }
  if (!res.ok) throw new Error(`${method} ${route} → ${res.status}: ${text.slice(0, 300)}`);
  return json;
}

/**
 * Opens `n` sessions, `parallel` at a time.
 * @param {string} base
 * @param {number} n
 * @param {{ parallel?: number, body?: (i: number) => object }} options
 * @returns {Promise<import("@rollgate/protocol").CreateSessionResponse[]>}
 */
export async function openSessions(base, n, { parallel = 16, body = () => ({}) } = {}) {
  const out = new Array(n);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(parallel, n) }, async () => {
      while (next < n) {
        const i = next++;
        out[i] = await api(base, "/v1/sessions", { method: "POST", body: body(i) });
      }
    }),
  );
  return out;
}
