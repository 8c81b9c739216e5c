// Exercise the sidecar from Node.js: put, merge, get, history, a
// conflicting put, fork, sessions and delete. Prints one JSON object with what it saw.
//   node demo.js unix:/path/ckpt.sock SESSION
'use strict';

const { CheckpointClient, ConflictError } = require('./ckpt_client');

async function main() {
  const [target, session] = process.argv.slice(2);
  const client = new CheckpointClient(target);
  // Checkpoint{schema_version: 1, goal: "node"} and a patch Checkpoint{step: 2}
  // written by hand in protobuf wire format: field 1 varint, field 5 string, field 2 varint.
  const state = Buffer.from([0x08, 0x01, 0x2a, 0x04, 0x6e, 0x6f, 0x64, 0x65]);
  const patch = Buffer.from([0x10, 0x02]);
  const out = {};
  const first = await client.put(session, state, { labels: { lang: 'node' } });
  out.put = { version: first.version, frame_kind: first.frame_kind };
  const second = await client.merge(session, patch, { expectedVersion: first.version });
  out.merge = { version: second.version, frame_kind: second.frame_kind };
  const got = await client.get(session);
  out.get = { version: got.version, state_hex: Buffer.from(got.state).toString('hex') };
  const old = await client.get(session, 1);
  out.get_v1 = { version: old.version, state_hex: Buffer.from(old.state).toString('hex') };
  out.history = (await client.history(session)).map((v) => ({ version: v.version, mode: v.mode, labels: v.labels }));
  try {
    await client.put(session, state, { expectedVersion: 1 });
    out.conflict = null;
  } catch (err) {
    if (!(err instanceof ConflictError)) throw err;
    out.conflict = { current_version: err.currentVersion, message: err.message };
  }
  const started = new Date(Date.now() - 60000);
  const fork = await client.fork(session, `${session}-fork`, { version: 1, labels: { lang: 'node' } });
  out.fork = { session_id: fork.session_id, head: fork.head_version, from: fork.forked_from_version };
  out.sessions = [];
  for await (const s of client.sessions({ labels: { lang: 'node' }, updatedAfter: started, pageSize: 1 })) {
    out.sessions.push(s.session_id);
  }
  out.sessions_later = [];
  for await (const s of client.sessions({ updatedAfter: new Date(Date.now() + 60000) })) {
    out.sessions_later.push(s.session_id);
  }
  out.deleted = await client.delete(`${session}-fork`);
  try {
    await client.delete(`${session}-fork`);
  } catch (err) {
    out.delete_again = err.code;
  }
  client.close();
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((err) => {
  process.stderr.write(`ckpt node demo failed: ${err.stack || err}\n`);
  process.exit(1);
});
