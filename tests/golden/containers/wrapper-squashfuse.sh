#!/bin/bash
# python of the packed environment tools, written by sitestack (pack-env):
# runs /proj/sitestack/envs/.tools.gen-0123abcd/root/bin/python with /proj/sitestack/envs/.tools.gen-0123abcd/env.sqfs mounted at /proj/sitestack/envs/.tools.gen-0123abcd/root.
root=/proj/sitestack/envs/.tools.gen-0123abcd/root
image=/proj/sitestack/envs/.tools.gen-0123abcd/env.sqfs
if ! { [ -d "$root" ] && [ -e "$root/bin" ]; }; then
  exec 9<"$image" && flock 9
  if ! [ -d "$root" ]; then
    fusermount3 -u -z "$root" 2>/dev/null || fusermount -u -z "$root" 2>/dev/null
  fi
  if ! mountpoint -q "$root"; then
    if command -v squashfuse_ll >/dev/null 2>&1; then mount=(squashfuse_ll); else mount=(squashfuse -o kernel_cache,entry_timeout=86400,attr_timeout=86400,negative_timeout=86400); fi
    "${mount[@]}" "$image" "$root" 9<&- || {
      echo "python: cannot mount $image at $root (${mount[0]})" >&2; exit 1; }
  fi
  exec 9<&-
fi
exec "$root/bin/python" "$@"
