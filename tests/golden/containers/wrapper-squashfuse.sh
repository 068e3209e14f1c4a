#!/bin/bash
# python of the packed environment tools, written by sitestack (pack-env):
# runs /proj/sitestack/envs/.tools.gen-0123abcd/root/bin/python with /proj/sitestack/envs/.tools.gen-0123abcd/env.sqfs mounted at /proj/sitestack/envs/.tools.gen-0123abcd/root.
root=/proj/sitestack/envs/.tools.gen-0123abcd/root
image=/proj/sitestack/envs/.tools.gen-0123abcd/env.sqfs
if ! mountpoint -q "$root"; then
  exec 9<"$image" && flock 9
  mountpoint -q "$root" || squashfuse "$image" "$root" || {
    echo "python: cannot mount $image at $root (squashfuse)" >&2; exit 1; }
  exec 9<&-
fi
exec "$root/bin/python" "$@"
