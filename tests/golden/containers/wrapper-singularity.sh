#!/bin/bash
# torchrun of the packed environment tools, written by sitestack (pack-env):
# runs /proj/sitestack/envs/.tools.gen-0123abcd/root/bin/torchrun with /proj/sitestack/envs/.tools.gen-0123abcd/env.sqfs mounted at /proj/sitestack/envs/.tools.gen-0123abcd/root.
root=/proj/sitestack/envs/.tools.gen-0123abcd/root
image=/proj/sitestack/envs/.tools.gen-0123abcd/env.sqfs
if grep -qsF " $root " /proc/self/mountinfo; then exec "$root/bin/torchrun" "$@"; fi
exec singularity exec --bind /proj/sitestack,/var/spool/slurmd,/opt/cray,"$image:$root:image-src=/" /proj/sitestack/pytorch.sif "$root/bin/torchrun" "$@"
