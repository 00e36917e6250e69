import type { Server } from "node:http";
import type { Socket } from "node:net";

/**
 * Ends, when the gateway closes, the connections on which no request has begun (not a byte read).
 *
 * Node's `server.close()` ends idle keep-alive connections, but a connection that has not sent a
 * byte yet is not idle to it (its header timer runs from the connect), so the close waits until
 * the client drops it, and the onClose hooks (the drain that stores answered calls' records) wait
 * with it. Agents' HTTP clients leave such connections: Node's fetch, when an agent aborts a call,
 * re-queues the aborted request, connects again for it and keeps the unused connection until its
 * keep-alive timeout (4 s); a client that preconnects may keep one until the server's headers
 * timeout (60 s), past the shutdown's grace. Nothing was asked on them, so nothing is lost: a
 * client sends its next request on a new connection, as after any idle keep-alive one is ended.
 *
 * Returns what the close runs (before the server stops listening).
 */
export function unusedConnectionsCloser(server: Server): () => void {
  const open = new Set<Socket>();
  server.on("connection", (socket: Socket) => {
    open.add(socket);
    socket.once("close", () => open.delete(socket));
  });
  return () => {
    for (const socket of open) if (socket.bytesRead === 0) socket.destroy();
  };
}
