#!/usr/bin/env bash
# Fetches, as wheels, what engine torchtitan (python -m runner.titan) and bench/peer_torchtitan.py need on a GPU
# machine that has python 3.12 and a GPU build of torch (with Triton) but no torchao, pydantic or TorchTitan, and
# no network: the runner's two (torchao, pydantic and its three companions) and TorchTitan 0.2.2 with the
# dependencies such an image usually lacks. Nothing is installed here.
#
#   bash scripts/peer-wheels.sh [DEST]          # DEST defaults to .whl in the repository root (git-ignored)
#
# Then, on the GPU machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site DEST/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#   python3 -m runner.titan --spec spec.json --out result.json       # under torchrun for several GPUs
#
# A node with network installs the same with pip install '.[torchtitan]'. TorchTitan's own requirements that are
# not fetched (tokenizers, fsspec, tensorboard, einops, pillow; datasets' pyarrow, pandas, huggingface-hub, xxhash,
# requests, tqdm, pyyaml) and numpy are expected on the image: torchtitan.models.llama3 imports its dataset and
# tokenizer modules even though runner.titan feeds runner.data's batches and builds no tokenizer. 0.2.2 is the
# newest TorchTitan whose imports torch 2.11 has (0.3.0 needs newer torch APIs and drops the tensorwise recipe);
# it also imports under torch 2.13.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
dest=${1:-$top/.whl}
mkdir -p "$dest"
plat=()
for n in 17 24 27 28 34; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
runner=(torchao==0.18.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)
peer=(torchtitan==0.2.2 datasets==5.2.0 torchdata==0.11.0 tyro==1.0.17 docstring-parser==0.18.0
      typeguard==4.6.1 dill==0.4.1 multiprocess==0.70.19)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$dest" "${runner[@]}" "${peer[@]}"
# one version of each package: two would stop the --no-deps install
dups=$(ls "$dest" | sed -E 's/-[0-9][^-]*-.*\.whl$//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dups" ]; then echo "more than one wheel of: $dups (clear $dest and fetch again)" >&2; exit 1; fi
ls "$dest"
du -sh "$dest"
