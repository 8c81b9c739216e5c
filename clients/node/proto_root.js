// Where the client reads the .proto files of the ckpt service from. In the
// repository this folder is clients/node and the files are the repository's
// proto/, the one source of them; an installed copy of the package (npm pack,
// npm install --install-links) carries its own proto/, copied in by the
// `prepare` script (copy_protos.js) when it was packed.
'use strict';

const fs = require('fs');
const path = require('path');

const CHECKOUT_PROTO = path.resolve(__dirname, '..', '..', 'proto');
const PACKED_PROTO = path.join(__dirname, 'proto');

function inCheckout() {
  return (
    path.basename(__dirname) === 'node' &&
    path.basename(path.dirname(__dirname)) === 'clients' &&
    fs.existsSync(path.join(CHECKOUT_PROTO, 'ckpt', 'v1', 'service.proto'))
  );
}

const PROTO_ROOT = inCheckout() ? CHECKOUT_PROTO : PACKED_PROTO;

module.exports = { CHECKOUT_PROTO, PACKED_PROTO, PROTO_ROOT, inCheckout };
