#!/bin/sh
# git, threaded and forking, on a generated repository: run in a directory
# holding three versions of a source tree (v1, v2, v3), commits them, then
# repacks with 8 delta-search threads (git gc --aggressive forks repack,
# pack-objects, prune, ...; git repack; git index-pack --threads=8;
# git grep --threads=8). Prints only what depends on the content, not on
# how the threads divided the work (a pack's bytes may), so that a run
# under LD_PRELOAD can be compared byte for byte with a plain run.
set -eu
export GIT_AUTHOR_NAME=pagewise GIT_AUTHOR_EMAIL=test@pagewise.invalid
export GIT_COMMITTER_NAME=pagewise GIT_COMMITTER_EMAIL=test@pagewise.invalid
export GIT_AUTHOR_DATE='2001-02-03T04:05:06Z' GIT_COMMITTER_DATE='2001-02-03T04:05:06Z'
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME="$PWD" LC_ALL=C TZ=UTC

git init -q -b main repo
cd repo
for v in v1 v2 v3; do
    cp -R "../$v/." .
    git add -A
    git commit -q -m "$v"
done
echo "head $(git rev-parse HEAD)"
echo "log $(git log --stat --format='%H %s' | sha256sum)"

git -c pack.threads=8 -c gc.autoDetach=false gc --aggressive --quiet
git count-objects -v | grep -E '^(count|in-pack|packs|prune-packable|garbage):'
git fsck --full --strict --no-progress
echo "objects $(git cat-file --batch-all-objects --batch-check | sort | sha256sum)"

git -c pack.threads=8 repack -a -d -f -q --window=50 --depth=20
git count-objects -v | grep -E '^(count|in-pack|packs):'
echo "grep $(git grep --threads=8 -c -e 'heap' -e 'slab' | sha256sum)"

# One thread packs deterministically; eight threads index it again.
pack=$(git pack-objects --revs --all --threads=1 -q ../det </dev/null)
echo "pack $pack"
git index-pack --threads=8 -o ../again.idx "../det-$pack.pack"
cmp "../det-$pack.idx" ../again.idx
echo "verify $(git verify-pack -v "../det-$pack.idx" | sha256sum)"
git fsck --full --strict --no-progress
echo done
