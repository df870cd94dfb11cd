#!/bin/sh
# The two libraries the page at / uses, from the npm registry at pinned versions (npm checks each
# tarball's integrity), copied into llmrun/server/web/vendor/ with their licenses. Nothing is built:
# the files are the packages' own distributed builds, less their source-map comments.
# Run from the repository root: sh scripts/vendor-web.sh
set -eu
MARKED=18.3.0     # Markdown → HTML (MIT)
DOMPURIFY=3.5.0   # HTML sanitiser: what marked makes of a model's answer goes through it (Apache-2.0 / MPL-2.0)
out=llmrun/server/web/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "marked@$MARKED" "dompurify@$DOMPURIFY" >/dev/null)
for pkg in "marked-$MARKED" "dompurify-$DOMPURIFY"; do mkdir "$work/$pkg" && tar xzf "$work/$pkg.tgz" -C "$work/$pkg"; done
strip() { grep -v '^//# sourceMappingURL=' "$1" > "$2"; }
strip "$work/marked-$MARKED/package/lib/marked.esm.js" "$out/marked.esm.js"
strip "$work/dompurify-$DOMPURIFY/package/dist/purify.min.js" "$out/purify.min.js"
cp "$work/marked-$MARKED/package/LICENSE" "$out/LICENSE.marked"
cp "$work/dompurify-$DOMPURIFY/package/dist/../LICENSE" "$out/LICENSE.dompurify"
echo "marked $MARKED, DOMPurify $DOMPURIFY → $out"
