#!/usr/bin/env bash
# Prepare MaxText (the real llama training client) for a GPU run, on a machine with pip and a fetched
# MaxText mirror (the search tool's fetch of github:AI-Hypercomputer/maxtext gives a bare git dir):
#     bash integration/maxtext/prepare.sh MIRROR_GIT_DIR DEST
# Makes DEST/.mt (MaxText's src/maxtext at the mirror's HEAD, ~9 MB, plus a stub `xprof` package that
# tokamax imports) and DEST/.wheels (the 22 pure-Python/manylinux wheels MaxText needs that the GPU
# machine lacks, ~12 MB, for python 3.12). The GPU machine already has jax 0.11.2, flax, optax, orbax,
# chex, numpy, transformers: none of those are downloaded. Then see run.py.
set -euo pipefail
git_dir=${1:?usage: prepare.sh MIRROR_GIT_DIR DEST}
dest=${2:?usage: prepare.sh MIRROR_GIT_DIR DEST}
mt=$(mkdir -p "$dest" && cd "$dest" && pwd)/.mt
rm -rf "$mt"; mkdir -p "$mt"
# The mirror may lack some large blobs (tokenizers that synthetic data does not need), and `git archive`
# fails on a missing blob even when a pathspec excludes it: the tree goes through a temporary index
# without the missing blobs, and checkout-index writes what is left.
index=$(mktemp); trap 'rm -f "$index"' EXIT
export GIT_INDEX_FILE=$index
git --git-dir="$git_dir" read-tree HEAD
git --git-dir="$git_dir" ls-files -s -- src/maxtext pyproject.toml LICENSE | while read -r _ sha _ path; do
  git --git-dir="$git_dir" cat-file -e "$sha" 2>/dev/null || printf '%s\n' "$path"
done | git --git-dir="$git_dir" update-index --force-remove --stdin
git --git-dir="$git_dir" ls-files -- src/maxtext pyproject.toml LICENSE \
  | git --git-dir="$git_dir" checkout-index --prefix="$mt/" --stdin
unset GIT_INDEX_FILE
git --git-dir="$git_dir" rev-parse HEAD >"$mt/MAXTEXT_COMMIT"
# Notebooks and tokenizers other than llama2's are not needed for synthetic data.
find "$mt" -name '*.ipynb' -delete
find "$mt/src/maxtext/assets/tokenizers" -mindepth 1 -maxdepth 1 ! -name tokenizer.llama2 -exec rm -rf {} +
mkdir -p "$mt/stubs/xprof/cli"
: >"$mt/stubs/xprof/__init__.py"; : >"$mt/stubs/xprof/cli/__init__.py"
echo 'get_kernel_stats_tool = None' >"$mt/stubs/xprof/cli/tools.py"
whl=$dest/.wheels
mkdir -p "$whl"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for p in pathwaysutils==0.1.13 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 pydantic==2.14.4 \
         pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
         opentelemetry-api==1.45.2 omegaconf==2.4.0 qwix==0.1.8 aqtp==0.9.0 tokamax==0.0.17 \
         immutabledict==4.3.1 einshape==1.0 tensorboardx==2.6.5 grain==0.2.18 portpicker==1.6.0 \
         array-record==0.8.6 drjax==0.2.1 ml-collections==1.1.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$whl" "$p"
done
du -sh "$mt" "$whl"
