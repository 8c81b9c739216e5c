// The `prepare` script (npm pack, npm install --install-links, npm install
// here): copies the repository's proto/ into this folder's proto/, which the
// packed package carries (package.json `files`) and an installed copy reads
// (proto_root.js). The copy is ignored by git; proto/ stays the source.
'use strict';

const fs = require('fs');
const { CHECKOUT_PROTO, PACKED_PROTO, inCheckout } = require('./proto_root');

if (inCheckout()) {
  fs.rmSync(PACKED_PROTO, { recursive: true, force: true });
  fs.cpSync(CHECKOUT_PROTO, PACKED_PROTO, { recursive: true, filter: (source) => !source.endsWith('~') });
} else if (!fs.existsSync(PACKED_PROTO)) {
  // Outside the repository (an unpacked tarball) the package carries its copy already.
  throw new Error(`no .proto files: neither ${CHECKOUT_PROTO} nor ${PACKED_PROTO} exists`);
}
