import net from "node:net";

/**
 * A client connection and its own connection to the target, tracked in `open` while they last and
 * closed together (what every TCP proxy of the tests does before deciding what passes between them).
 */
export function connectPair(client: net.Socket, host: string, port: number, open: Set<net.Socket>): net.Socket {
  const upstream = net.connect(port, host);
  for (const s of [client, upstream]) {
    open.add(s);
    s.on("close", () => open.delete(s));
    s.on("error", () => undefined);
  }
  client.on("close", () => upstream.destroy());
  upstream.on("close", () => client.destroy());
  return upstream;
}
