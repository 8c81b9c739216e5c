// A small Node.js client for the ckpt sidecar. It needs nothing but the
// .proto files in proto/: the service is loaded at run time with
// @grpc/proto-loader, so any language with a gRPC library can do the same.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

function loadService() {
  const definition = protoLoader.loadSync('ckpt/v1/service.proto', {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
    longs: Number, // versions and sizes stay far below 2^53
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).ckpt.v1.CheckpointService;
}

class ConflictError extends Error {
  constructor(message, currentVersion) {
    super(message);
    this.name = 'ConflictError';
    this.currentVersion = currentVersion;
  }
}

class CheckpointClient {
  // target: "unix:/path/ckpt.sock" or "host:port"
  constructor(target) {
    const Service = loadService();
    this.stub = new Service(target, grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
    });
  }

  call(method, request) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, (err, reply) => {
        if (!err) return resolve(reply);
        if (err.code === grpc.status.ABORTED) {
          const head = err.metadata && err.metadata.get('ckpt-current-version')[0];
          return reject(new ConflictError(err.details, Number(head || 0)));
        }
        reject(err);
      });
    });
  }

  put(sessionId, state, { expectedVersion, requestId, labels } = {}) {
    return this.call('Put', this.request(sessionId, state, 'WRITE_MODE_REPLACE', expectedVersion, requestId, labels));
  }

  merge(sessionId, patch, { expectedVersion, requestId, labels } = {}) {
    return this.call('Put', this.request(sessionId, patch, 'WRITE_MODE_MERGE', expectedVersion, requestId, labels));
  }

  request(sessionId, state, mode, expectedVersion, requestId, labels) {
    const req = {
      session_id: sessionId,
      state: Buffer.from(state),
      mode,
      request_id: requestId || require('crypto').randomUUID(),
      labels: labels || {},
    };
    if (expectedVersion !== undefined) req.expected_version = expectedVersion;
    return req;
  }

  get(sessionId, version = 0) {
    return this.call('Get', { session_id: sessionId, version });
  }

  async history(sessionId) {
    const versions = [];
    let token = '';
    do {
      const page = await this.call('ListVersions', { session_id: sessionId, page_size: 100, page_token: token });
      versions.push(...page.versions);
      token = page.next_page_token;
    } while (token);
    return versions;
  }

  close() {
    this.stub.close();
  }
}

module.exports = { CheckpointClient, ConflictError };
